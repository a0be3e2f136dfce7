package pgrelay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/ledger"
	"github.com/pgrelay/pgrelay/internal/logtest"
)

// fastConfig returns a worker configuration with short intervals for tests.
func fastConfig(t testing.TB, pool *pgxpool.Pool, h pgrelay.InboxHandler) pgrelay.InboxConfig {
	return pgrelay.InboxConfig{
		Pool:           pool,
		Handler:        h,
		Logger:         logtest.New(t),
		Workers:        2,
		BatchSize:      20,
		Lease:          5 * time.Second,
		HandlerTimeout: 2 * time.Second,
		MaxAttempts:    5,
		BackoffMin:     5 * time.Millisecond,
		BackoffMax:     20 * time.Millisecond,
		PollInterval:   50 * time.Millisecond,
		DeferFallback:  time.Minute,
	}
}

// startWorker runs a worker until the test ends and returns a function that
// stops it and waits for Run to return.
func startWorker(t testing.TB, cfg pgrelay.InboxConfig) (stop func()) {
	t.Helper()
	w, err := pgrelay.NewInboxWorker(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				t.Errorf("worker did not stop")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func orderPaid(eventID, orderID string, cents int64) pgrelay.Incoming {
	b, _ := json.Marshal(ledger.OrderPaid{OrderID: orderID, AmountCents: cents, Currency: "EUR"})
	return pgrelay.Incoming{Message: pgrelay.Message{EventID: eventID, Topic: "orders", Key: orderID,
		EventType: ledger.EventOrderPaid, Payload: b}}
}

func receive(t testing.TB, pool *pgxpool.Pool, msgs ...pgrelay.Incoming) pgrelay.ReceiveResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := pgrelay.Receive(ctx, pool, msgs)
	require.NoError(t, err)
	return res
}

// createOrders inserts ledger orders directly (not through the inbox).
func createOrders(t testing.TB, pool *pgxpool.Pool, ids ...string) {
	t.Helper()
	for _, id := range ids {
		_, err := pool.Exec(context.Background(),
			`INSERT INTO ledger_orders (order_id, customer_id, amount_cents, currency, event_id)
			 VALUES ($1, 'c', 1000, 'EUR', 'seed-' || $1)`, id)
		require.NoError(t, err)
	}
}

func queryInt(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

type row struct {
	Status     string
	Attempts   int
	Deferrals  int
	LastError  string
	WaitingFor string
}

func inboxRow(t testing.TB, pool *pgxpool.Pool, id string) row {
	t.Helper()
	var r row
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT status, attempts, deferrals, coalesce(last_error, ''), coalesce(waiting_for, '')
		 FROM pgrelay.inbox WHERE event_id = $1`, id).Scan(&r.Status, &r.Attempts, &r.Deferrals, &r.LastError, &r.WaitingFor))
	return r
}

// waitStatus waits until the event has the status.
func waitStatus(t testing.TB, pool *pgxpool.Pool, id, status string, within time.Duration) row {
	t.Helper()
	var last row
	require.Eventually(t, func() bool {
		last = inboxRow(t, pool, id)
		return last.Status == status
	}, within, 10*time.Millisecond, "event %s never reached %s", id, status)
	return last
}

// waitAllDone waits until no inbox row is pending or processing.
func waitAllDone(t testing.TB, pool *pgxpool.Pool, within time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox WHERE status IN ('pending', 'processing')`) == 0
	}, within, 20*time.Millisecond, "inbox never drained")
}

func entries(t testing.TB, pool *pgxpool.Pool, eventID string) int {
	return queryInt(t, pool, `SELECT count(*) FROM ledger_entries WHERE event_id = $1`, eventID)
}

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%05d", prefix, i)
	}
	return out
}

// onceChan returns a channel and a function closing it, safe to call twice.
func onceChan() (<-chan struct{}, func()) {
	ch := make(chan struct{})
	var once sync.Once
	return ch, func() { once.Do(func() { close(ch) }) }
}

func orderCreatedMessage(eventID, orderID string) pgrelay.Message {
	b, _ := json.Marshal(ledger.OrderCreated{OrderID: orderID, CustomerID: "c-" + orderID, AmountCents: 1000, Currency: "EUR"})
	return pgrelay.Message{EventID: eventID, Topic: "orders", Key: orderID, EventType: ledger.EventOrderCreated, Payload: b}
}
