package migrations_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/migrations"
)

// TestIdentityMigrationCarriesRowsOver: inbox rows stored before migration
// 00070 belong to the handler 'default', keyed by their event id under the
// message-id strategy, with their payload's fingerprint; a redelivery of one
// is still a duplicate. Rolling back refuses while a named handler's rows
// exist, and goes back to event_id as the key once they are gone.
func TestIdentityMigrationCarriesRowsOver(t *testing.T) {
	t.Parallel()
	url := testdb.EmptyURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	defer pool.Close()
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()
	p, err := migrations.NewProvider(sqlDB)
	require.NoError(t, err)
	_, err = p.UpTo(ctx, 65)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO pgrelay.inbox (event_id, payload, status) VALUES
		('old-1', 'one', 'processed'), ('old-2', 'two', 'pending')`)
	require.NoError(t, err)

	_, err = p.UpTo(ctx, 70)
	require.NoError(t, err)
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pgrelay.inbox
		WHERE handler = 'default' AND dedup_key = event_id
		  AND key_strategy = 'message-id' AND fingerprint = sha256(payload)`).Scan(&n))
	require.Equal(t, 2, n)
	tag, err := pool.Exec(ctx, `INSERT INTO pgrelay.inbox (event_id, payload) VALUES ('old-1', 'again') ON CONFLICT (handler, dedup_key) DO NOTHING`)
	require.NoError(t, err)
	require.Zero(t, tag.RowsAffected(), "a redelivery of a migrated row is a duplicate")
	_, err = pool.Exec(ctx, `INSERT INTO pgrelay.inbox (handler, event_id) VALUES ('mail', 'old-1')`)
	require.NoError(t, err, "another handler stores the same event")

	_, err = p.Down(ctx)
	require.ErrorContains(t, err, "migrate down: 00070_inbox_identity would drop data")
	_, err = pool.Exec(ctx, `DELETE FROM pgrelay.inbox WHERE handler = 'mail'`)
	require.NoError(t, err)
	_, err = p.Down(ctx)
	require.NoError(t, err)
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pgrelay.inbox`).Scan(&n))
	require.Equal(t, 2, n, "the default handler's rows stay")
	_, err = pool.Exec(ctx, `INSERT INTO pgrelay.inbox (event_id) VALUES ('old-2')`)
	require.ErrorContains(t, err, "inbox_pkey", "event_id is the key again")
}
