package pgrelay_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// enqueueOnce is the idempotent-producer pattern: the order row and its event
// commit together; a retry of the whole operation with the same event id is
// recognised as done (ErrDuplicateEvent) without aborting the transaction.
func enqueueOnce(ctx context.Context, tx pgx.Tx, msg pgrelay.Message) (string, error) {
	err := pgrelay.Enqueue(ctx, tx, msg)
	switch {
	case err == nil:
		return "enqueued", nil
	case errors.Is(err, pgrelay.ErrDuplicateEvent):
		return "already enqueued, identical: commit as success", nil
	case errors.Is(err, pgrelay.ErrEventIDConflict):
		return "event id reused for a different event: roll back", err
	default:
		return "failed", err
	}
}

// A producer retrying with the same event id.
func ExampleEnqueue_duplicate() {
	decide := func(err error) string {
		switch {
		case err == nil:
			return "enqueued"
		case errors.Is(err, pgrelay.ErrDuplicateEvent):
			return "duplicate: treat as success and commit"
		case errors.Is(err, pgrelay.ErrEventIDConflict):
			return "conflict: roll back and investigate"
		}
		return "failed: " + err.Error()
	}
	// What Enqueue returns for a first write, a retry and a reused id.
	fmt.Println(decide(nil))
	fmt.Println(decide(fmt.Errorf("outbox: message 0: event id %q: %w", "pay-42", pgrelay.ErrDuplicateEvent)))
	fmt.Println(decide(fmt.Errorf("outbox: message 0: event id %q: %w", "pay-42", pgrelay.ErrEventIDConflict)))
	// Output:
	// enqueued
	// duplicate: treat as success and commit
	// conflict: roll back and investigate
}

func TestEnqueueDuplicateFromRoot(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	msg := pgrelay.Message{EventID: "pay-42", Topic: "payments", Key: "order-42", EventType: "PaymentRequested", Payload: []byte(`{"amount":1999}`)}
	var got []string
	for _, m := range []pgrelay.Message{msg, msg} {
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			what, err := enqueueOnce(ctx, tx, m)
			got = append(got, what)
			return err
		}))
	}
	changed := msg
	changed.Payload = []byte(`{"amount":2999}`)
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		what, err := enqueueOnce(ctx, tx, changed)
		got = append(got, what)
		return err
	})
	require.ErrorIs(t, err, pgrelay.ErrEventIDConflict)
	require.Equal(t, []string{"enqueued", "already enqueued, identical: commit as success", "event id reused for a different event: roll back"}, got)
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pgrelay.outbox`).Scan(&n))
	require.Equal(t, 1, n)
}
