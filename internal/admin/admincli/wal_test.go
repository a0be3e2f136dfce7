package admincli_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/admin"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// TestCLIWALAcceptGap: "wal accept-gap" needs a reason, accepts the slot's
// open gap (printing its range), records who and why, and refuses when no
// gap is open.
func TestCLIWALAcceptGap(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = pool.Exec(context.Background(), `INSERT INTO pgrelay.wal_gaps (slot, from_lsn, confirmed_at, to_lsn, cause)
		VALUES ('pgrelay', '0/3001810', '2026-11-28T16:36:50Z', '0/3001EE0', 'the slot is missing after a promotion')`)
	require.NoError(t, err)

	_, err = runCLI(t, url, "wal", "accept-gap", "--actor", "alice")
	require.ErrorIs(t, err, admin.ErrInvalid)
	require.ErrorContains(t, err, "reason is required")
	out, err := runCLI(t, url, "wal", "accept-gap", "--actor", "alice", "--reason", "window re-emitted")
	require.NoError(t, err)
	require.Equal(t, "slot pgrelay: accepted the gap 0/3001810-0/3001EE0 (last confirmed position recorded at 2026-11-28T16:36:50Z; the slot is missing after a promotion)\n", out)
	var by, why string
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT accepted_by, accept_reason FROM pgrelay.wal_gaps WHERE accepted_at IS NOT NULL`).Scan(&by, &why))
	require.Equal(t, []string{"alice", "window re-emitted"}, []string{by, why})
	_, err = runCLI(t, url, "wal", "accept-gap", "--actor", "alice", "--reason", "again")
	require.ErrorContains(t, err, `slot "pgrelay" has no gap waiting to be accepted`)
}
