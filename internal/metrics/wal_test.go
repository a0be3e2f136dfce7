package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// TestWALGapGauge: relay_wal_gap is 1 while the relay reports a gap that
// stops its capture (relay.WALSlotStatus.Gap), 0 once it streams again.
func TestWALGapGauge(t *testing.T) {
	reg := prometheus.NewRegistry()
	o := NewWALObserver(reg)
	gap := func() float64 {
		t.Helper()
		mfs, err := reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			if mf.GetName() == "relay_wal_gap" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("relay_wal_gap is not exported")
		return 0
	}
	require.Zero(t, gap())
	o.WALSlot(0, 0, false, "", true)
	require.Equal(t, 1.0, gap())
	require.Equal(t, 1.0, testutil.ToFloat64(o.gap))
	o.WALSlot(0, 0, true, "reserved", false)
	require.Zero(t, gap())
}
