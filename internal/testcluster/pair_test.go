package testcluster

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestPair: a row committed while the standby still streams survives the
// failover, one committed after StopReceiving does not, and the promoted
// standby takes writes, reached through the pair's multi-host URL.
func TestPair(t *testing.T) {
	t.Parallel()
	p := StartPair(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	exec := func(c *Cluster, sql string) {
		t.Helper()
		require.NoError(t, query(ctx, c, sql, nil))
	}
	count := func(url, sql string) (n int) {
		t.Helper()
		conn, err := pgx.Connect(ctx, url)
		require.NoError(t, err)
		defer conn.Close(ctx)
		require.NoError(t, conn.QueryRow(ctx, sql).Scan(&n))
		return n
	}
	exec(p.Primary, "CREATE TABLE t (v text)")
	exec(p.Primary, "INSERT INTO t VALUES ('streamed')")
	require.NoError(t, p.CatchUp(ctx))
	require.Equal(t, 1, count(p.Standby.URL(), "SELECT count(*) FROM t"))

	require.NoError(t, p.StopReceiving(ctx))
	exec(p.Primary, "INSERT INTO t VALUES ('primary only')")
	require.Equal(t, 2, count(p.URL(), "SELECT count(*) FROM t"), "the URL reaches the primary, though the standby comes first")
	require.NoError(t, p.CrashPrimary(ctx))
	require.NoError(t, p.Promote(ctx))

	exec(p.Standby, "INSERT INTO t VALUES ('after')")
	require.Equal(t, 0, count(p.URL(), "SELECT count(*) FROM t WHERE v = 'primary only'"), "lost with the primary")
	require.Equal(t, 2, count(p.URL(), "SELECT count(*) FROM t"))
}
