package migrations_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/testdb"
)

// TestDuplicatesDownKeepsResetAudit: rolling back 00080 refuses while the
// audit trail records a dedup statistics reset (the older constraint cannot
// hold it), and with pgrelay.force_down=on deletes those rows and goes ahead.
func TestDuplicatesDownKeepsResetAudit(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pool, version, ops := provider(t, url, false)
	before, err := version(ctx)
	require.NoError(t, err)
	for before > 80 {
		_, err := ops.down(ctx)
		require.NoError(t, err)
		before, err = version(ctx)
		require.NoError(t, err)
	}
	require.Equal(t, int64(80), before)
	_, err = pool.Exec(ctx, `INSERT INTO pgrelay.replay_audit (source, action, event_id, actor) VALUES ('inbox', 'reset_dedup_stats', '*', 'alice'), ('inbox', 'purge', 'e1', 'bob')`)
	require.NoError(t, err)
	_, err = ops.down(ctx)
	require.ErrorContains(t, err, "migrate down: 00080_inbox_duplicates would drop data")
	after, err := version(ctx)
	require.NoError(t, err)
	require.Equal(t, before, after, "a refused rollback changes nothing")

	forced, version, fops := provider(t, url, true)
	_, err = fops.down(ctx)
	require.NoError(t, err)
	after, err = version(ctx)
	require.NoError(t, err)
	require.Less(t, after, int64(80))
	var n int
	require.NoError(t, forced.QueryRow(ctx, `SELECT count(*) FROM pgrelay.replay_audit`).Scan(&n))
	require.Equal(t, 1, n, "only the reset row is gone")
	require.NoError(t, fops.up(ctx))
}
