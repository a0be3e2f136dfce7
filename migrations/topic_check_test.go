package migrations_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/testdb"
)

// TestTopicCheckMigration: 00095 applies over rows stored before it with
// invalid topics: the pending ones go dead with the reason, published ones
// are left alone (the constraint is NOT VALID, so they do not fail the
// migration), valid pending rows stay pending, and a new invalid insert is
// refused. It rolls back without --force.
func TestTopicCheckMigration(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pool, version, ops := provider(t, url, true)
	v, err := version(ctx)
	require.NoError(t, err)
	for v >= 95 {
		_, err := ops.down(ctx)
		require.NoError(t, err)
		v, err = version(ctx)
		require.NoError(t, err)
	}
	_, err = pool.Exec(ctx, `INSERT INTO pgrelay.outbox (event_id, topic, key, payload) VALUES
		('p-wild', 'orders.*', 'k1', '\x'), ('p-space', 'a b', 'k2', '\x'), ('p-ok', 'orders.created', 'k3', '\x'),
		('pub-bad', 'x y', 'k4', '\x')`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE pgrelay.outbox SET status = 'published', published_at = now() WHERE event_id = 'pub-bad'`)
	require.NoError(t, err)

	require.NoError(t, ops.up(ctx), "old rows with invalid topics must not fail the migration")
	status := map[string]string{}
	errs := map[string]string{}
	rows, err := pool.Query(ctx, `SELECT event_id, status, coalesce(last_error, '') FROM pgrelay.outbox`)
	require.NoError(t, err)
	for rows.Next() {
		var id, st, le string
		require.NoError(t, rows.Scan(&id, &st, &le))
		status[id], errs[id] = st, le
	}
	require.NoError(t, rows.Err())
	require.Equal(t, map[string]string{"p-wild": "dead", "p-space": "dead", "p-ok": "pending", "pub-bad": "published"}, status)
	require.Contains(t, errs["p-wild"], `topic 'orders.*' is invalid`)
	require.Contains(t, errs["p-space"], `topic 'a b' is invalid`)

	// NOT VALID, then (00112) a rule of the insert trigger: old rows are not
	// checked either way.
	var validated bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT coalesce((SELECT convalidated FROM pg_constraint WHERE conname = 'outbox_topic_valid'), false)`).Scan(&validated))
	require.False(t, validated, "NOT VALID: old rows are not checked")
	_, err = pool.Exec(ctx, `INSERT INTO pgrelay.outbox (topic, payload) VALUES ('orders.>', '\x')`)
	require.ErrorContains(t, err, "outbox_topic_valid")

	_, plainVersion, plain := provider(t, url, false)
	for v, err = plainVersion(ctx); err == nil && v >= 95; v, err = plainVersion(ctx) {
		_, err = plain.down(ctx)
		require.NoError(t, err, "nothing is lost: no --force needed")
	}
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO pgrelay.outbox (topic, payload) VALUES ('orders.>', '\x')`)
	require.NoError(t, err, "rolled back: the constraint is gone")
}
