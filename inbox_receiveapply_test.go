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

// TestReceiveApplyGivesTheClaimedEvent: the Event a handler sees when its
// row is applied on receive is the one a worker's claim gives it for the
// same message: headers, content type, trace context and expiry lifted from
// them, payload, occurred-at as stored (microseconds), received-at as stored,
// key and key sequence, attempt 1, fencing version 1. The message is stored
// for two handlers in one statement: one applies it on receive, the other's
// worker claims it.
func TestReceiveApplyGivesTheClaimedEvent(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	var onReceive, claimed atomic.Pointer[pgrelay.InboxEvent]
	capture := func(p *atomic.Pointer[pgrelay.InboxEvent]) pgrelay.InboxHandler {
		return pgrelay.HandlerFunc(func(_ context.Context, _ pgx.Tx, ev *pgrelay.InboxEvent) error {
			c := *ev
			p.Store(&c)
			return nil
		})
	}
	cfg := fastConfig(t, pool, capture(&onReceive))
	cfg.HandlerName = "on-receive"
	w, err := pgrelay.NewInboxWorker(cfg)
	require.NoError(t, err)

	m := pgrelay.Incoming{Message: pgrelay.Message{
		EventID: "same-1", Topic: "orders", Key: "order-7", KeySeq: 3, EventType: "OrderPaid",
		Payload:     []byte(`{"order_id": "order-7",  "amount_cents": 100}`),
		ContentType: "application/json",
		Headers:     map[string]string{"x-tenant": "t1", "x-html": "<a&b>", "x-unicode": "é✓"},
		OccurredAt:  time.Date(2026, 11, 26, 1, 2, 3, 123456789, time.FixedZone("x", 3600)),
		ExpiresAt:   time.Now().Add(time.Hour).Round(0),
		TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		TraceState:  "vendor=value",
	}}
	res, n := receiveAndApplyWith(t, w, pool,
		pgrelay.ReceiveOptions{Targets: []pgrelay.Target{{Handler: "on-receive"}, {Handler: "claimed"}}}, m)
	require.Equal(t, 2, res.Inserted)
	require.Equal(t, 1, n)

	ccfg := fastConfig(t, pool, capture(&claimed))
	ccfg.HandlerName = "claimed"
	startWorker(t, ccfg)
	require.Eventually(t, func() bool { return claimed.Load() != nil }, 10*time.Second, 10*time.Millisecond)

	got, want := *onReceive.Load(), *claimed.Load()
	require.Equal(t, "on-receive", got.Handler)
	require.Equal(t, "claimed", want.Handler)
	var received time.Time
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT received_at FROM pgrelay.inbox WHERE handler = 'on-receive' AND event_id = 'same-1'`).Scan(&received))
	require.True(t, got.ReceivedAt.Equal(received), "received_at %s on receive, %s stored", got.ReceivedAt, received)
	require.Equal(t, int64(3), got.KeySeq)
	require.Equal(t, 1, got.Attempts)
	require.Equal(t, int64(1), got.LockVersion)
	got.Handler = want.Handler
	require.Equal(t, want, got, "the event applied on receive differs from the claimed one")
}

// TestReceiveApplyFailureRecordsDuplicatesOnce: a batch holding a
// redelivery of a stored event and a key repeated within the batch records
// its duplicates (inbox_duplicates) and counts itself (inbox_receive_counts)
// once, whether it is applied on receive or its handler fails there: the
// failure rolls back the processed rows, the handler's effects and those
// records, and the batch is stored again, pending, with no attempt counted.
// Keeping the processed insert or its records after a failure turns this
// red.
func TestReceiveApplyFailureRecordsDuplicatesOnce(t *testing.T) {
	t.Parallel()
	for _, fail := range []bool{false, true} {
		pool := testdb.New(t)
		createOrders(t, pool, "o-1", "o-2", "o-3")
		var calls atomic.Int64
		var broke atomic.Bool
		h := pgrelay.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
			calls.Add(1)
			if err := (ledger.Handler{}).Handle(ctx, tx, ev); err != nil {
				return err
			}
			if fail && ev.EventID == "d-3" && broke.CompareAndSwap(false, true) {
				panic("handler breaks after its effect")
			}
			return nil
		})
		cfg := fastConfig(t, pool, h)
		w, err := pgrelay.NewInboxWorker(cfg)
		require.NoError(t, err)
		receive(t, pool, orderPaid("d-1", "o-1", 100)) // stored before: the batch's copy is a redelivery
		calls.Store(0)

		res, n := receiveAndApply(t, w, pool,
			orderPaid("d-1", "o-1", 100), orderPaid("d-2", "o-2", 200), orderPaid("d-2", "o-2", 200), orderPaid("d-3", "o-3", 300))
		require.Equal(t, 2, res.Inserted, "fail=%v", fail)
		require.ElementsMatch(t, []string{"d-1", "d-2"}, res.Duplicates, "fail=%v", fail)
		require.Equal(t, 2, queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox_duplicates`), "fail=%v", fail)
		require.Equal(t, 1+4, queryInt(t, pool, `SELECT sum(received)::int FROM pgrelay.inbox_receive_counts`), "fail=%v", fail)
		require.Equal(t, 2, queryInt(t, pool, `SELECT sum(duplicates)::int FROM pgrelay.inbox_receive_counts`), "fail=%v", fail)
		require.EqualValues(t, 2, calls.Load(), "fail=%v: each stored event runs once on receive", fail)
		if !fail {
			require.Equal(t, 2, n)
			for _, id := range []string{"d-2", "d-3"} {
				r := inboxRow(t, pool, id)
				require.Equal(t, "processed", r.Status, id)
				require.Equal(t, 1, r.Attempts, id)
				require.Equal(t, 1, entries(t, pool, id), id)
			}
			continue
		}
		require.Zero(t, n)
		for _, id := range []string{"d-2", "d-3"} {
			r := inboxRow(t, pool, id)
			require.Equal(t, "pending", r.Status, id)
			require.Zero(t, r.Attempts, id)
			require.Zero(t, entries(t, pool, id), "the failed apply's effect on %s committed", id)
		}
		require.Equal(t, 2, queryInt(t, pool,
			`SELECT count(*) FROM pgrelay.inbox WHERE event_id IN ('d-2', 'd-3') AND lock_version = 0 AND locked_by IS NULL AND started_at IS NULL AND finished_at IS NULL`))
		startWorker(t, cfg)
		waitAllDone(t, pool, 10*time.Second)
		for _, id := range []string{"d-2", "d-3"} {
			require.Equal(t, "processed", inboxRow(t, pool, id).Status, id)
			require.Equal(t, 1, inboxRow(t, pool, id).Attempts, id)
			require.Equal(t, 1, entries(t, pool, id), id)
		}
	}
}

// TestReceiveApplySwallowedErrorLeavesRowsPending: a handler that swallows
// the error of a statement that aborted the transaction and returns nil does
// not count as applied: the batch is stored pending in a transaction that
// still commits, instead of the commit rolling the whole store back.
// Trusting the handler's nil there turns this red (the commit fails).
func TestReceiveApplySwallowedErrorLeavesRowsPending(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	var swallow atomic.Bool
	swallow.Store(true)
	h := pgrelay.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
		if swallow.Load() {
			_, err := tx.Exec(ctx, `SELECT 1/0`)
			require.Error(t, err)
		}
		return nil
	})
	cfg := fastConfig(t, pool, h)
	w, err := pgrelay.NewInboxWorker(cfg)
	require.NoError(t, err)
	res, n := receiveAndApply(t, w, pool, orderPaid("sw-1", "o-1", 100))
	require.Equal(t, 1, res.Inserted)
	require.Zero(t, n)
	r := inboxRow(t, pool, "sw-1")
	require.Equal(t, "pending", r.Status)
	require.Zero(t, r.Attempts)

	swallow.Store(false)
	startWorker(t, cfg)
	waitAllDone(t, pool, 10*time.Second)
	require.Equal(t, "processed", inboxRow(t, pool, "sw-1").Status)
}

// TestReceiveApplyStoresOnlyForOrderedWorkers: an ordered worker applies
// nothing on receive; its rows are stored pending, for its claims.
func TestReceiveApplyStoresOnlyForOrderedWorkers(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	var calls atomic.Int64
	h := pgrelay.HandlerFunc(func(context.Context, pgx.Tx, *pgrelay.InboxEvent) error {
		calls.Add(1)
		return errors.New("not on receive")
	})
	w, err := pgrelay.NewInboxWorker(orderedConfig(t, pool, h, &seqObserver{}))
	require.NoError(t, err)
	res, n := receiveAndApply(t, w, pool, seqMsg("or-1", "k", 1), seqMsg("or-2", "k", 2))
	require.Equal(t, 2, res.Inserted)
	require.Zero(t, n)
	require.Zero(t, calls.Load())
	require.Equal(t, 2, queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox WHERE status = 'pending' AND attempts = 0`))
}
