package relay

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// TestStandbyNamesNeedsTheStatsRole: with StandbyNames, a role that cannot
// see pg_stat_replication's LSN columns (it would wait for ever) is refused
// at start-up, naming the setting and the grant; granted pg_monitor, it
// passes.
func TestStandbyNamesNeedsTheStatsRole(t *testing.T) {
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	role := fmt.Sprintf("standby_waiter_%d", time.Now().UnixNano())
	_, err := b.pool.Exec(ctx, `CREATE ROLE `+role+` LOGIN`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = b.pool.Exec(context.Background(), `DROP ROLE `+role) })
	pool, err := pgxpool.New(ctx, strings.Replace(b.dbURL, "postgres@", role+"@", 1))
	require.NoError(t, err)
	defer pool.Close()

	cfg := b.testConfig(t, b.publisher(t), nil)
	cfg.Pool, cfg.StandbyNames = pool, []string{"standby"}
	r, err := New(cfg)
	require.NoError(t, err)
	err = r.Run(ctx)
	require.ErrorContains(t, err, "StandbyNames: the database role cannot see the standbys' positions in pg_stat_replication")
	require.ErrorContains(t, err, "GRANT pg_monitor (or pg_read_all_stats)")

	_, err = b.pool.Exec(ctx, `GRANT pg_monitor TO `+role)
	require.NoError(t, err)
	require.NoError(t, r.checkStandbys(ctx))
}
