package ledger_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/inboxtest"
	"github.com/pgrelay/pgrelay/internal/ledger"
	"github.com/pgrelay/pgrelay/internal/logtest"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

func created(eventID, orderID string) pgrelay.Incoming {
	b, _ := json.Marshal(ledger.OrderCreated{OrderID: orderID, CustomerID: "cust-7", AmountCents: 4200, Currency: "EUR"})
	return pgrelay.Incoming{Message: pgrelay.Message{EventID: eventID, Topic: "orders", Key: orderID,
		EventType: ledger.EventOrderCreated, Payload: b}}
}

func paid(eventID, orderID string) pgrelay.Incoming {
	b, _ := json.Marshal(ledger.OrderPaid{OrderID: orderID, AmountCents: 4200, Currency: "EUR"})
	return pgrelay.Incoming{Message: pgrelay.Message{EventID: eventID, Topic: "orders", Key: orderID,
		EventType: ledger.EventOrderPaid, Payload: b}}
}

func raw(eventID, eventType, payload string) pgrelay.Incoming {
	return pgrelay.Incoming{Message: pgrelay.Message{EventID: eventID, EventType: eventType, Payload: []byte(payload)}}
}

func config(t *testing.T, pool *pgxpool.Pool, h pgrelay.InboxHandler, workerID string) pgrelay.InboxConfig {
	return pgrelay.InboxConfig{
		Pool: pool, Handler: h, Logger: logtest.New(t).With(slog.String("logger", workerID)), WorkerID: workerID,
		Workers: 1, Lease: 5 * time.Second, HandlerTimeout: 2 * time.Second,
		BackoffMin: 5 * time.Millisecond, BackoffMax: 20 * time.Millisecond,
		PollInterval: 50 * time.Millisecond, DeferFallback: time.Minute,
	}
}

func run(t *testing.T, cfg pgrelay.InboxConfig) {
	w, err := pgrelay.NewInboxWorker(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

func receive(t *testing.T, pool *pgxpool.Pool, msgs ...pgrelay.Incoming) {
	t.Helper()
	_, err := pgrelay.Receive(context.Background(), pool, msgs)
	require.NoError(t, err)
}

type state struct {
	Status    string
	Attempts  int
	Deferrals int
	LastError string
}

func get(t *testing.T, pool *pgxpool.Pool, id string) state {
	t.Helper()
	var s state
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT status, attempts, deferrals, coalesce(last_error, '') FROM pgrelay.inbox WHERE event_id = $1`, id).
		Scan(&s.Status, &s.Attempts, &s.Deferrals, &s.LastError))
	return s
}

func waitFor(t *testing.T, pool *pgxpool.Pool, id string, cond func(state) bool) state {
	t.Helper()
	var s state
	require.Eventually(t, func() bool { s = get(t, pool, id); return cond(s) }, 10*time.Second, 10*time.Millisecond,
		"event %s: last state %+v", id, &s)
	return s
}

func credits(t *testing.T, pool *pgxpool.Pool, orderID string) int {
	var n int
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT count(*) FROM ledger_entries WHERE order_id = $1`, orderID).Scan(&n))
	return n
}

// TestPaidBeforeCreated: an OrderPaid arriving before its OrderCreated is
// deferred without burning attempts, then credited exactly once as soon as the
// order exists (woken by Release, long before the one-minute fallback).
func TestPaidBeforeCreated(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	run(t, config(t, pool, ledger.Handler{}, "w"))

	receive(t, pool, paid("pay-1", "o1"))
	s := waitFor(t, pool, "pay-1", func(s state) bool { return s.Deferrals >= 1 })
	require.Equal(t, state{Status: "pending", Attempts: 0, Deferrals: 1, LastError: "deferred: waiting for order:o1"}, s)

	receive(t, pool, created("create-1", "o1"))
	s = waitFor(t, pool, "pay-1", func(s state) bool { return s.Status == "processed" })
	require.Equal(t, 1, s.Attempts, "deferrals do not count as attempts")
	require.Equal(t, 1, s.Deferrals)
	require.Equal(t, 1, credits(t, pool, "o1"))
	require.Empty(t, s.LastError, "a processed event keeps no deferral reason")
	var customer string
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT customer_id FROM ledger_entries WHERE event_id = 'pay-1'`).Scan(&customer))
	require.Equal(t, "cust-7", customer)
}

// TestReleaseDuringDeferral: the OrderCreated commits (and releases) while the
// OrderPaid handler, which did not see the order yet, is about to defer. The
// deferral must not miss that release: the OrderPaid runs again at once, not
// after the one-minute fallback.
func TestReleaseDuringDeferral(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	inHandler := make(chan struct{})
	createdCommitted := make(chan struct{})
	var once sync.Once
	slowPaid := pgrelay.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
		err := ledger.Handler{}.Handle(ctx, tx, ev)
		var d *pgrelay.DeferError
		if errors.As(err, &d) {
			once.Do(func() {
				close(inHandler)
				<-createdCommitted
			})
		}
		return err
	})
	run(t, config(t, pool, slowPaid, "A"))
	receive(t, pool, paid("pay-1", "o1"))
	<-inHandler

	stats := &inboxtest.CountingObserver{}
	cfgB := config(t, pool, ledger.Handler{}, "B")
	cfgB.Observer = stats
	run(t, cfgB)
	receive(t, pool, created("create-1", "o1"))
	require.Eventually(t, func() bool { return stats.ProcessedCount("create-1") == 1 }, 10*time.Second, 5*time.Millisecond)
	close(createdCommitted)

	s := waitFor(t, pool, "pay-1", func(s state) bool { return s.Status == "processed" })
	require.Equal(t, 1, s.Deferrals)
	require.Equal(t, 1, credits(t, pool, "o1"))
}

// TestMalformedEventsAreDead: malformed JSON, missing fields, wrong types and
// unknown event types go dead at the first attempt with a clear reason.
func TestMalformedEventsAreDead(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	run(t, config(t, pool, ledger.Handler{}, "w"))
	cases := map[string]struct {
		msg    pgrelay.Incoming
		reason string
	}{
		"json":     {raw("json", ledger.EventOrderPaid, `{"order_id": `), "permanent: OrderPaid payload: not a JSON object: unexpected end of JSON input"},
		"missing":  {raw("missing", ledger.EventOrderCreated, `{"order_id":"o1","amount_cents":1}`), "permanent: OrderCreated payload: missing or empty field(s): customer_id, currency"},
		"type":     {raw("type", ledger.EventOrderPaid, `{"order_id":"o1","amount_cents":"12","currency":"EUR"}`), "permanent: OrderPaid payload: field amount_cents: want int64, got JSON string"},
		"negative": {raw("negative", ledger.EventOrderCreated, `{"order_id":"o1","customer_id":"c","amount_cents":-5,"currency":"EUR"}`), "permanent: OrderCreated payload: amount_cents is negative (-5)"},
		"unknown":  {raw("unknown", "OrderShipped", `{}`), `permanent: unknown event type "OrderShipped"`},
		"nul":      {raw("nul", ledger.EventOrderPaid, `{"order_id":"o\u00001","amount_cents":1,"currency":"EUR"}`), "permanent: OrderPaid payload: field order_id: contains a NUL character, which PostgreSQL text cannot store"},
		"long":     {raw("long", ledger.EventOrderCreated, `{"order_id":"`+strings.Repeat("x", 300)+`","customer_id":"c","amount_cents":1,"currency":"EUR"}`), "permanent: OrderCreated payload: field order_id: longer than 255 bytes"},
	}
	for _, c := range cases {
		receive(t, pool, c.msg)
	}
	for id, c := range cases {
		s := waitFor(t, pool, id, func(s state) bool { return s.Status == "dead" })
		require.Equal(t, 1, s.Attempts, id)
		require.Equal(t, c.reason, s.LastError, id)
	}
}

// countingHandler counts which path applied the events.
type countingHandler struct {
	ledger.Handler
	bulk, bulkRefused, single atomic.Int32
}

func (h *countingHandler) HandleBatch(ctx context.Context, tx pgx.Tx, evs []*pgrelay.InboxEvent) error {
	err := h.Handler.HandleBatch(ctx, tx, evs)
	if err != nil {
		h.bulkRefused.Add(1)
	} else {
		h.bulk.Add(1)
	}
	return err
}

func (h *countingHandler) Handle(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
	h.single.Add(1)
	return h.Handler.Handle(ctx, tx, ev)
}

// TestBatchPath: a batch of orders and their payments is applied in bulk,
// without a single per-event call; a batch holding a malformed event and a
// payment for an order not created yet is refused in bulk and run event by
// event: the malformed one dead, the early payment deferred until its order
// comes, the rest credited once.
func TestBatchPath(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	var msgs []pgrelay.Incoming
	for i := range 20 {
		msgs = append(msgs, created(fmt.Sprintf("c%d", i), fmt.Sprintf("o%d", i)), paid(fmt.Sprintf("p%d", i), fmt.Sprintf("o%d", i)))
	}
	receive(t, pool, msgs...)
	h := &countingHandler{}
	run(t, config(t, pool, h, "w"))
	for i := range 20 {
		waitFor(t, pool, fmt.Sprintf("p%d", i), func(s state) bool { return s.Status == "processed" })
	}
	require.Zero(t, h.single.Load(), "no event needed a per-event call")
	require.Zero(t, h.bulkRefused.Load())
	require.Positive(t, h.bulk.Load())

	receive(t, pool, paid("p-early", "o-later"), raw("bad", ledger.EventOrderPaid, "{"), paid("p-ok", "o1"))
	waitFor(t, pool, "bad", func(s state) bool { return s.Status == "dead" })
	waitFor(t, pool, "p-ok", func(s state) bool { return s.Status == "processed" })
	waitFor(t, pool, "p-early", func(s state) bool { return s.Deferrals == 1 })
	require.Positive(t, h.bulkRefused.Load())
	require.GreaterOrEqual(t, int(h.single.Load()), 3)

	receive(t, pool, created("c-later", "o-later"))
	s := waitFor(t, pool, "p-early", func(s state) bool { return s.Status == "processed" })
	require.Equal(t, 1, s.Attempts)
	require.Equal(t, 1, credits(t, pool, "o-later"))
	require.Equal(t, 2, credits(t, pool, "o1"))
	for i := range 20 {
		if i != 1 {
			require.Equal(t, 1, credits(t, pool, fmt.Sprintf("o%d", i)))
		}
	}
}

// TestCreditUniqueEventIDIsTheSecondLineOfDefence: should the inbox ever run
// an OrderPaid twice (a fencing bug, an operator replaying by hand), the
// ledger's UNIQUE(event_id) refuses the second credit: the handler fails with
// a unique violation and the order stays credited once.
func TestCreditUniqueEventIDIsTheSecondLineOfDefence(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	handle := func(in pgrelay.Incoming) error {
		ev := &pgrelay.InboxEvent{Message: in.Message, Attempts: 1}
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return ledger.Handler{}.Handle(ctx, tx, ev) })
	}
	require.NoError(t, handle(created("c-1", "o-unique")))
	require.NoError(t, handle(paid("p-1", "o-unique")))
	err := handle(paid("p-1", "o-unique")) // the same event applied again, bypassing the inbox
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, "the second credit of one event must be refused")
	require.Equal(t, "23505", pgErr.Code)
	require.Equal(t, 1, credits(t, pool, "o-unique"))
	// A different payment of the same order is credited.
	require.NoError(t, handle(paid("p-2", "o-unique")))
	require.Equal(t, 2, credits(t, pool, "o-unique"))
}
