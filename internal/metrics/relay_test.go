package metrics

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/broker/nats"
	"github.com/pgrelay/pgrelay/internal/logtest"
	"github.com/pgrelay/pgrelay/internal/relay"
	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/internal/testnats"
)

var _ relay.Observer = (*RelayObserver)(nil)

// TestMetricsFollowTheRealRelay runs the real relay against JetStream and
// reads /metrics over HTTP until the published counter, the lag histogram,
// the lease counters and the outbox gauges say what happened.
func TestMetricsFollowTheRealRelay(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	natsURL := testnats.URL(t)
	stream, prefix := testnats.Stream(t, natsURL)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pub, err := nats.NewPublisher(ctx, nats.Config{URL: natsURL, SubjectPrefix: prefix, Stream: stream})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })

	reg := NewRegistry()
	obs := NewRelayObserver(reg)
	coll, err := NewOutboxCollector(DBCollectorConfig{Pool: pool, CacheFor: time.Nanosecond})
	require.NoError(t, err)
	reg.MustRegister(coll)
	srv, err := NewServer(ServerConfig{Registry: reg})
	require.NoError(t, err)
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()

	for i := range 5 {
		_, err := pool.Exec(ctx, `INSERT INTO pgrelay.outbox (event_id, topic, key, event_type) VALUES ($1, 'orders', $2, 'OrderPaid')`,
			fmt.Sprintf("evt-%d", i), fmt.Sprintf("order-%d", i%2))
		require.NoError(t, err)
	}
	m := scrape(t, hs.URL+"/metrics")
	require.Equal(t, 5.0, m["outbox_pending_rows"])
	require.Zero(t, m["relay_published_total"])

	r, err := relay.New(relay.Config{Pool: pool, Publisher: pub, Observer: obs,
		Logger: logtest.NewAt(t, slog.LevelWarn), PollInterval: 20 * time.Millisecond,
		Lease: 3 * time.Second})
	require.NoError(t, err)
	rctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	t.Cleanup(func() { stop(); <-done })

	require.Eventually(t, func() bool {
		m = scrape(t, hs.URL+"/metrics")
		return m["relay_published_total"] == 5 && m["outbox_pending_rows"] == 0
	}, 20*time.Second, 20*time.Millisecond, "the relay never published the 5 rows")
	require.GreaterOrEqual(t, m["relay_outbox_lag_seconds_count"], 1.0)
	require.GreaterOrEqual(t, m["relay_publish_duration_seconds_count"], 1.0)
	require.Positive(t, m["relay_lease_acquired_total"])
	require.Zero(t, m["relay_publish_duplicates_total"])
	require.Zero(t, m["relay_fenced_total"])
	require.Zero(t, m["outbox_oldest_pending_age_seconds"])
}
