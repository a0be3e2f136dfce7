package testdb_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/testdb"
)

func TestNewGivesSeparateMigratedDatabases(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := testdb.New(t), testdb.New(t)

	var nameA, nameB string
	require.NoError(t, a.QueryRow(ctx, "SELECT current_database()").Scan(&nameA))
	require.NoError(t, b.QueryRow(ctx, "SELECT current_database()").Scan(&nameB))
	require.NotEqual(t, nameA, nameB)

	// Both are migrated, and a write to one is invisible in the other.
	_, err := a.Exec(ctx, "INSERT INTO pgrelay.inbox (event_id) VALUES ('e1')")
	require.NoError(t, err)
	var n int
	require.NoError(t, b.QueryRow(ctx, "SELECT count(*) FROM pgrelay.inbox").Scan(&n))
	require.Zero(t, n)
}
