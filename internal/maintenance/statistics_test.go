package maintenance_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/maintenance"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// TestStatisticsAnalyzesAStaleTable: a table that changed by more than the
// thresholds since its last analyze is analyzed once; a table another
// service is analyzing is left alone; a small change is not enough.
func TestStatisticsAnalyzesAStaleTable(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := maintenance.Statistics{Pool: pool, Table: "inbox"}
	analyzed := func() int64 {
		var n int64
		require.NoError(t, pool.QueryRow(ctx, `SELECT analyze_count FROM pg_stat_user_tables WHERE relid = 'pgrelay.inbox'::regclass`).Scan(&n))
		return n
	}
	before := analyzed()
	// Changes reach pg_stat_user_tables when the writing backend reports
	// them, within about a second of its going idle.
	changedBy := func(n int64) {
		require.Eventually(t, func() bool {
			var mods int64
			require.NoError(t, pool.QueryRow(ctx, `SELECT n_mod_since_analyze FROM pg_stat_user_tables WHERE relid = 'pgrelay.inbox'::regclass`).Scan(&mods))
			return mods >= n
		}, 20*time.Second, 50*time.Millisecond, "the inserts never showed in the statistics")
	}

	_, err := pool.Exec(ctx, `INSERT INTO pgrelay.inbox (event_id, topic) SELECT 'small-' || g, 'orders' FROM generate_series(1, 500) AS g`)
	require.NoError(t, err)
	changedBy(500)
	did, err := s.RunOnce(ctx)
	require.NoError(t, err)
	require.False(t, did, "500 changed rows are below the 1,000 minimum")

	_, err = pool.Exec(ctx, `INSERT INTO pgrelay.inbox (event_id, topic) SELECT 'e-' || g, 'orders' FROM generate_series(1, 5000) AS g`)
	require.NoError(t, err)
	changedBy(5500)
	// Another service holds the turn: this one skips.
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(1885434467, hashtext('inbox'))`)
		require.NoError(t, err)
		did, err := s.RunOnce(ctx)
		require.NoError(t, err)
		require.False(t, did, "the table is being analyzed by another service")
		return nil
	}))
	require.Equal(t, before, analyzed())

	did, err = s.RunOnce(ctx)
	require.NoError(t, err)
	require.True(t, did)
	require.Equal(t, before+1, analyzed())
	var tuples float64
	require.NoError(t, pool.QueryRow(ctx, `SELECT reltuples FROM pg_class WHERE oid = 'pgrelay.inbox'::regclass`).Scan(&tuples))
	require.InDelta(t, 5500, tuples, 1)

	// Analyzed: no longer stale.
	did, err = s.RunOnce(ctx)
	require.NoError(t, err)
	require.False(t, did)
}

// TestStatisticsRefusesAnUnknownTable: only pgrelay's own tables.
func TestStatisticsRefusesAnUnknownTable(t *testing.T) {
	t.Parallel()
	_, err := maintenance.Statistics{Table: "ledger_entries"}.RunOnce(context.Background())
	require.ErrorContains(t, err, `unknown table "ledger_entries"`)
}
