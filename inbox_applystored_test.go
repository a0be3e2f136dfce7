package pgrelay_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/ledger"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// countingObserver counts claims and processed events.
type countingObserver struct {
	pgrelay.NopObserver
	claimed, processed atomic.Int64
}

func (o *countingObserver) Claimed(n, _ int)                             { o.claimed.Add(int64(n)) }
func (o *countingObserver) Processed(*pgrelay.InboxEvent, time.Duration) { o.processed.Add(1) }

// receiveAndApply stores msgs and applies them with ReceiveApply in one
// transaction, as the consumer does, and reports them after the commit.
func receiveAndApply(t *testing.T, w *pgrelay.InboxWorker, pool interface {
	Begin(context.Context) (pgx.Tx, error)
}, msgs ...pgrelay.Incoming) (pgrelay.ReceiveResult, int) {
	t.Helper()
	return receiveAndApplyWith(t, w, pool, pgrelay.ReceiveOptions{}, msgs...)
}

// receiveAndApplyWith is receiveAndApply with opts.
func receiveAndApplyWith(t *testing.T, w *pgrelay.InboxWorker, pool interface {
	Begin(context.Context) (pgx.Tx, error)
}, opts pgrelay.ReceiveOptions, msgs ...pgrelay.Incoming) (pgrelay.ReceiveResult, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	res, applied, err := w.ReceiveApply(ctx, tx, msgs, opts, nil)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	applied.Committed(ctx)
	return res, applied.Len()
}

// TestApplyStoredProcessesInTheReceivingTransaction: events stored and applied
// in one transaction are processed (one attempt, credited once) without any
// worker claiming them; a redelivery is absorbed and applies nothing.
func TestApplyStoredProcessesInTheReceivingTransaction(t *testing.T) {
	pool := testdb.New(t)
	createOrders(t, pool, "o-1", "o-2", "o-3")
	obs := &countingObserver{}
	cfg := fastConfig(t, pool, ledger.Handler{})
	cfg.Observer = obs
	w, err := pgrelay.NewInboxWorker(cfg)
	require.NoError(t, err)

	msgs := []pgrelay.Incoming{orderPaid("as-1", "o-1", 100), orderPaid("as-2", "o-2", 200), orderPaid("as-3", "o-3", 300)}
	res, n := receiveAndApply(t, w, pool, msgs...)
	require.Equal(t, 3, res.Inserted)
	require.Equal(t, 3, n)
	for _, id := range []string{"as-1", "as-2", "as-3"} {
		r := inboxRow(t, pool, id)
		require.Equal(t, "processed", r.Status, id)
		require.Equal(t, 1, r.Attempts, id)
		require.Equal(t, 1, entries(t, pool, id), id)
	}
	require.Equal(t, 1, queryInt(t, pool, `SELECT count(DISTINCT lock_version) FROM pgrelay.inbox WHERE event_id LIKE 'as-%' AND lock_version = 1`))
	require.EqualValues(t, 3, obs.claimed.Load())
	require.EqualValues(t, 3, obs.processed.Load())

	// A single event takes the per-event path (Handle, not HandleBatch).
	createOrders(t, pool, "o-4")
	_, n = receiveAndApply(t, w, pool, orderPaid("as-4", "o-4", 400))
	require.Equal(t, 1, n)
	require.Equal(t, 1, entries(t, pool, "as-4"))

	// Redelivered: nothing stored, nothing applied, still one credit each.
	res, n = receiveAndApply(t, w, pool, msgs...)
	require.Equal(t, 0, res.Inserted)
	require.Equal(t, 0, n)
	require.Equal(t, 1, entries(t, pool, "as-1"))
}

// TestApplyStoredFailureLeavesRowsToTheWorkers: when one handler of the batch
// fails, none of the batch's effects commit and every row stays pending with
// no attempt counted; the workers then process them with the usual retries,
// each credited exactly once. Applying rows whose effects are rolled back,
// or leaving a failed event's partial state, turns this red.
func TestApplyStoredFailureLeavesRowsToTheWorkers(t *testing.T) {
	pool := testdb.New(t)
	createOrders(t, pool, "o-1", "o-2", "o-3")
	var failing atomic.Bool
	failing.Store(true)
	h := pgrelay.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
		if ev.EventID == "af-2" && failing.Load() {
			return errors.New("downstream busy")
		}
		return ledger.Handler{}.Handle(ctx, tx, ev)
	})
	cfg := fastConfig(t, pool, h)
	w, err := pgrelay.NewInboxWorker(cfg)
	require.NoError(t, err)

	res, n := receiveAndApply(t, w, pool, orderPaid("af-1", "o-1", 100), orderPaid("af-2", "o-2", 200), orderPaid("af-3", "o-3", 300))
	require.Equal(t, 3, res.Inserted)
	require.Equal(t, 0, n, "a failed handler must undo the whole batch's apply")
	for _, id := range []string{"af-1", "af-2", "af-3"} {
		r := inboxRow(t, pool, id)
		require.Equal(t, "pending", r.Status, id)
		require.Equal(t, 0, r.Attempts, id)
		require.Equal(t, 0, entries(t, pool, id), "effect of %s committed by a failed apply", id)
	}

	failing.Store(false)
	startWorker(t, cfg)
	waitAllDone(t, pool, 10*time.Second)
	for _, id := range []string{"af-1", "af-2", "af-3"} {
		require.Equal(t, "processed", inboxRow(t, pool, id).Status, id)
		require.Equal(t, 1, entries(t, pool, id), id)
	}
}

// TestApplyStoredSkipsOtherHandlersAndDeadRows: only the worker's handler's
// rows are applied; another handler's row and a row stored dead stay as
// they are.
func TestApplyStoredSkipsOtherHandlersAndDeadRows(t *testing.T) {
	pool := testdb.New(t)
	createOrders(t, pool, "o-1")
	var calls atomic.Int64
	h := pgrelay.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
		calls.Add(1)
		return ledger.Handler{}.Handle(ctx, tx, ev)
	})
	cfg := fastConfig(t, pool, h)
	cfg.HandlerName = "ledger"
	w, err := pgrelay.NewInboxWorker(cfg)
	require.NoError(t, err)

	dead := orderPaid("sk-dead", "o-1", 1)
	dead.DeadReason = "malformed"
	res, n := receiveAndApplyWith(t, w, pool, pgrelay.ReceiveOptions{Targets: []pgrelay.Target{{Handler: "ledger"}, {Handler: "audit"}}},
		orderPaid("sk-1", "o-1", 100), dead)
	require.Len(t, pgrelay.StoredRows(res), 4)
	require.Equal(t, 1, n)
	require.EqualValues(t, 1, calls.Load())
	require.Equal(t, "processed", queryString(t, pool, `SELECT status FROM pgrelay.inbox WHERE handler = 'ledger' AND event_id = 'sk-1'`))
	require.Equal(t, "pending", queryString(t, pool, `SELECT status FROM pgrelay.inbox WHERE handler = 'audit' AND event_id = 'sk-1'`))
	require.Equal(t, 2, queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox WHERE event_id = 'sk-dead' AND status = 'dead'`))
}

func queryString(t testing.TB, pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, sql string, args ...any) string {
	t.Helper()
	var s string
	require.NoError(t, pool.QueryRow(context.Background(), sql, args...).Scan(&s))
	return s
}
