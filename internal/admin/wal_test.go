package admin_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/admin"
	"github.com/pgrelay/pgrelay/internal/testcluster"
)

// TestStatsListWALSlots: stats show a WAL-capture relay's slot with its
// wal_status, lag and the WAL left before it would be lost.
func TestStatsListWALSlots(t *testing.T) {
	c := testcluster.Start(t, "wal_level = logical\nmax_slot_wal_keep_size = '64MB'")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, c.URL())
	require.NoError(t, err)
	defer pool.Close()
	svc, err := admin.New(admin.Config{Pool: pool})
	require.NoError(t, err)
	st, err := svc.Stats(ctx)
	require.NoError(t, err)
	require.Empty(t, st.WALSlots)

	_, err = pool.Exec(ctx, `SELECT pg_create_logical_replication_slot('pgrelay', 'pgoutput')`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `SELECT pg_logical_emit_message(true, 'pgrelay', repeat('x', 100000))`)
	require.NoError(t, err)
	st, err = svc.Stats(ctx)
	require.NoError(t, err)
	require.Len(t, st.WALSlots, 1)
	w := st.WALSlots[0]
	require.Equal(t, "pgrelay", w.Slot)
	require.Equal(t, "reserved", w.WALStatus)
	require.False(t, w.Active)
	require.Greater(t, w.LagBytes, int64(100000))
	require.NotNil(t, w.SafeWALSizeBytes)
}
