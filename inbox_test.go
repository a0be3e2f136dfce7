package pgrelay_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// TestInboxPublicAPI goes through the root package only: receive twice, run a
// handler that defers until another event releases it, and see one effect.
func TestInboxPublicAPI(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `CREATE TABLE effects (event_id text PRIMARY KEY)`)
	require.NoError(t, err)

	msgs := []pgrelay.Incoming{
		{Message: pgrelay.Message{EventID: "second", EventType: "B"}},
		{Message: pgrelay.Message{EventID: "first", EventType: "A"}},
	}
	res, err := pgrelay.Receive(ctx, pool, msgs)
	require.NoError(t, err)
	require.Equal(t, 2, res.Inserted)
	res, err = pgrelay.Receive(ctx, pool, msgs)
	require.NoError(t, err)
	require.Equal(t, []string{"second", "first"}, res.Duplicates)

	h := pgrelay.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
		switch ev.EventType {
		case "A":
			if err := pgrelay.Release(ctx, tx, "a-done"); err != nil {
				return err
			}
		case "B":
			var n int
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM effects WHERE event_id = 'first'`).Scan(&n); err != nil {
				return err
			}
			if n == 0 {
				return pgrelay.Defer("a-done")
			}
		default:
			return pgrelay.Permanent(errors.New("unknown event type"))
		}
		_, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1)`, ev.EventID)
		return err
	})
	w, err := pgrelay.NewInboxWorker(pgrelay.InboxConfig{Pool: pool, Handler: h, PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pgrelay.inbox WHERE status = 'processed'`).Scan(&n))
		return n == 2
	}, 10*time.Second, 10*time.Millisecond)
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM effects`).Scan(&n))
	require.Equal(t, 2, n)
	_, err = pgrelay.NewInboxWorker(pgrelay.InboxConfig{Pool: pool})
	require.ErrorContains(t, err, "Config.Handler")
}

// effectsHandler writes one effects row per event, in bulk when it can.
type effectsHandler struct{ bulk chan int }

func (effectsHandler) Handle(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
	_, err := tx.Exec(ctx, `INSERT INTO effects (event_id) VALUES ($1)`, ev.EventID)
	return err
}

func (h effectsHandler) HandleBatch(ctx context.Context, tx pgx.Tx, evs []*pgrelay.InboxEvent) error {
	ids := make([]string, len(evs))
	for i, ev := range evs {
		ids[i] = ev.EventID
	}
	if _, err := tx.Exec(ctx, `INSERT INTO effects (event_id) SELECT unnest($1::text[])`, ids); err != nil {
		return err
	}
	h.bulk <- len(evs)
	return nil
}

// TestInboxBatchHandlerPublicAPI: a handler implementing InboxBatchHandler
// applies a received batch in one call, and Wake reaches a worker that would
// otherwise poll only once an hour.
func TestInboxBatchHandlerPublicAPI(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `CREATE TABLE effects (event_id text PRIMARY KEY)`)
	require.NoError(t, err)
	h := effectsHandler{bulk: make(chan int, 10)}
	var _ pgrelay.InboxBatchHandler = h
	_, err = pgrelay.Receive(ctx, pool, []pgrelay.Incoming{
		{Message: pgrelay.Message{EventID: "e1", EventType: "A"}},
		{Message: pgrelay.Message{EventID: "e2", EventType: "A"}},
		{Message: pgrelay.Message{EventID: "e3", EventType: "A"}},
	})
	require.NoError(t, err)
	w, err := pgrelay.NewInboxWorker(pgrelay.InboxConfig{Pool: pool, Handler: h, Workers: 1, PollInterval: time.Hour})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	t.Cleanup(func() { stop(); require.NoError(t, <-done) })

	select {
	case n := <-h.bulk:
		require.Equal(t, 3, n, "the whole batch in one call")
	case <-time.After(10 * time.Second):
		t.Fatal("the batch handler never ran")
	}
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pgrelay.inbox WHERE status = 'processed'`).Scan(&n))
		return n == 3
	}, 10*time.Second, 10*time.Millisecond)

	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := pgrelay.Receive(ctx, tx, []pgrelay.Incoming{
			{Message: pgrelay.Message{EventID: "e4", EventType: "A"}},
			{Message: pgrelay.Message{EventID: "e5", EventType: "A"}},
		})
		return err
	}))
	w.Wake()
	select {
	case n := <-h.bulk:
		require.Equal(t, 2, n)
	case <-time.After(10 * time.Second):
		t.Fatal("Wake did not reach the worker")
	}
}
