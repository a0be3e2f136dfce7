package relay

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgrelay/pgrelay/internal/logtest"
	"github.com/stretchr/testify/require"
)

// TestRelayWarnsWhenPoolTooSmall: a pool with fewer connections than the
// relay's partitions use at once is named at start-up (pool_max_conns); a
// pool of PoolConns connections is not.
func TestRelayWarnsWhenPoolTooSmall(t *testing.T) {
	b := setup(t)
	var partitions int
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM pgrelay.relay_partitions`).Scan(&partitions))
	for _, tc := range []struct {
		conns int
		warn  bool
	}{{4, true}, {PoolConns(partitions), false}} {
		pcfg, err := pgxpool.ParseConfig(b.dbURL)
		require.NoError(t, err)
		pcfg.MaxConns = int32(tc.conns)
		pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
		require.NoError(t, err)
		core, logs := logtest.Observe(slog.LevelWarn)
		cfg := b.testConfig(t, b.publisher(t), nil)
		cfg.Pool, cfg.log = pool, core
		_, stop := start(t, cfg)
		// The first heartbeat computes the share and acquires it.
		require.Eventually(t, func() bool {
			var owned int
			_ = b.pool.QueryRow(context.Background(), `SELECT count(*) FROM pgrelay.relay_partitions WHERE owner IS NOT NULL`).Scan(&owned)
			return owned == partitions
		}, 10*time.Second, 10*time.Millisecond)
		stop()
		pool.Close()
		warned := logs.FilterMessageSnippet("pool_max_conns").All()
		if tc.warn {
			require.Len(t, warned, 1, "pool of %d connections for %d partitions", tc.conns, partitions)
			require.Equal(t, int64(tc.conns), warned[0].ContextMap()["pool_max_conns"])
			require.Equal(t, int64(PoolConns(partitions)), warned[0].ContextMap()["wanted_conns"])
		} else {
			require.Empty(t, warned, "pool of %d connections for %d partitions", tc.conns, partitions)
		}
	}
}
