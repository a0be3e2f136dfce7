package pgrelay_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// TestReceiveRecordsDuplicates checks that the receive statement records each
// duplicate it refused (with the handler and the original's receive time) and
// counts the batch, and that NoDuplicateRecord writes neither.
func TestReceiveRecordsDuplicates(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	opts := pgrelay.ReceiveOptions{Targets: []pgrelay.Target{{Handler: "ledger"}}}

	_, err := pgrelay.ReceiveWith(ctx, pool, []pgrelay.Incoming{orderPaid("a", "o1", 1), orderPaid("b", "o1", 1)}, opts)
	require.NoError(t, err)
	require.Zero(t, queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox_duplicates`))

	// a is a redelivery; c is new but repeated within the batch.
	res, err := pgrelay.ReceiveWith(ctx, pool, []pgrelay.Incoming{orderPaid("a", "o1", 1), orderPaid("c", "o1", 1), orderPaid("c", "o1", 1)}, opts)
	require.NoError(t, err)
	require.Equal(t, 1, res.Inserted)
	require.ElementsMatch(t, []string{"a", "c"}, res.Duplicates)

	rows, err := pool.Query(ctx, `SELECT event_id, handler, topic, original_received_at IS NOT NULL FROM pgrelay.inbox_duplicates ORDER BY event_id`)
	require.NoError(t, err)
	type rec struct {
		id, handler, topic string
		hasOriginal        bool
	}
	var got []rec
	for rows.Next() {
		var r rec
		require.NoError(t, rows.Scan(&r.id, &r.handler, &r.topic, &r.hasOriginal))
		got = append(got, r)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []rec{{"a", "ledger", "orders", true}, {"c", "ledger", "orders", false}}, got)

	var received, dups int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT sum(received), sum(duplicates) FROM pgrelay.inbox_receive_counts`).Scan(&received, &dups))
	require.Equal(t, int64(5), received)
	require.Equal(t, int64(2), dups)

	// Without the record: the duplicate is still refused, nothing is written.
	res, err = pgrelay.ReceiveWith(ctx, pool, []pgrelay.Incoming{orderPaid("b", "o1", 1)}, pgrelay.ReceiveOptions{Targets: opts.Targets, NoDuplicateRecord: true})
	require.NoError(t, err)
	require.Equal(t, []string{"b"}, res.Duplicates)
	require.Equal(t, 2, queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox_duplicates`))
	require.Equal(t, 5, queryInt(t, pool, `SELECT sum(received)::int FROM pgrelay.inbox_receive_counts`))
}

// TestReceiveRecordRolledBackWithBatch shows that the record belongs to the
// receive transaction: a batch rolled back leaves no duplicate behind.
func TestReceiveRecordRolledBackWithBatch(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := pgrelay.Receive(ctx, pool, []pgrelay.Incoming{orderPaid("a", "o1", 1)})
	require.NoError(t, err)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	res, err := pgrelay.Receive(ctx, tx, []pgrelay.Incoming{orderPaid("a", "o1", 1)})
	require.NoError(t, err)
	require.Equal(t, []string{"a"}, res.Duplicates)
	require.NoError(t, tx.Rollback(ctx))
	require.Zero(t, queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox_duplicates`))
	require.Equal(t, 1, queryInt(t, pool, `SELECT coalesce(sum(received), 0)::int FROM pgrelay.inbox_receive_counts`), "only the committed batch is counted")
}
