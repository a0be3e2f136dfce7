package pgrelay_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/ledger"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// TestWorkerRunsInboxRetention: a worker built with the default Config (as a
// library user of pgrelay.NewInboxWorker builds it) runs the inbox's upkeep:
// processed rows past the dedup window are deleted, younger ones and dead
// ones stay.
func TestWorkerRunsInboxRetention(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	_, err := pool.Exec(context.Background(), `INSERT INTO pgrelay.inbox (event_id, status, received_at, finished_at) VALUES
		('expired', 'processed', now() - interval '8 days', now() - interval '8 days'),
		('young', 'processed', now() - interval '6 days', now() - interval '6 days'),
		('dead-old', 'dead', now() - interval '60 days', now() - interval '60 days')`)
	require.NoError(t, err)
	startWorker(t, fastConfig(t, pool, ledger.Handler{}))
	require.Eventually(t, func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox WHERE event_id = 'expired'`) == 0
	}, 10*time.Second, 20*time.Millisecond, "the worker ran no inbox retention")
	require.Equal(t, 2, queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox WHERE event_id IN ('young', 'dead-old')`))
}

// TestWorkerKeepsTheInboxStatistics: the worker analyzes an inbox whose
// statistics went stale (maintenance.Statistics), so that the batch marks'
// plans are made with the table's real size; and never when told not to.
func TestWorkerKeepsTheInboxStatistics(t *testing.T) {
	t.Parallel()
	for _, on := range []bool{true, false} {
		t.Run(map[bool]string{true: "on", false: "off"}[on], func(t *testing.T) {
			t.Parallel()
			pool := testdb.New(t)
			_, err := pool.Exec(context.Background(), `INSERT INTO pgrelay.inbox (event_id, status, finished_at)
				SELECT 'e-' || g, 'processed', now() FROM generate_series(1, 5000) AS g`)
			require.NoError(t, err)
			cfg := fastConfig(t, pool, ledger.Handler{})
			cfg.StatisticsInterval = 100 * time.Millisecond
			if !on {
				cfg.StatisticsInterval = -1
			}
			startWorker(t, cfg)
			analyzed := func() bool {
				return queryInt(t, pool, `SELECT analyze_count FROM pg_stat_user_tables WHERE relid = 'pgrelay.inbox'::regclass`) > 0
			}
			if on {
				require.Eventually(t, analyzed, 20*time.Second, 50*time.Millisecond, "the worker never analyzed the stale inbox")
				return
			}
			time.Sleep(3 * time.Second)
			require.False(t, analyzed(), "analyzed with the check turned off")
		})
	}
}
