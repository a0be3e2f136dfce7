package pgrelay_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay"
)

// An inbox handler crediting payments: its insert commits in the same
// transaction as the event's processed mark, so it happens exactly once per
// event however often the broker delivers it.
func ExampleNewInboxWorker() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	handler := pgrelay.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
		var p struct {
			OrderID     string `json:"order_id"`
			AmountCents int64  `json:"amount_cents"`
		}
		if err := json.Unmarshal(ev.Payload, &p); err != nil {
			return pgrelay.Permanent(fmt.Errorf("bad payload: %w", err))
		}
		tag, err := tx.Exec(ctx, `INSERT INTO payments (event_id, order_id, amount_cents)
			SELECT $1, order_id, $3 FROM orders WHERE order_id = $2`, ev.EventID, p.OrderID, p.AmountCents)
		if err != nil {
			return err // retried with backoff
		}
		if tag.RowsAffected() == 0 {
			return pgrelay.Defer("order:" + p.OrderID) // runs again once the order exists
		}
		return nil
	})
	worker, err := pgrelay.NewInboxWorker(pgrelay.InboxConfig{Pool: pool, Handler: handler, PollInterval: 50 * time.Millisecond})
	if err != nil {
		panic(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- worker.Run(runCtx) }() // until the context ends

	orderID, eventID := uuid.NewString(), uuid.NewString()
	if _, err := pool.Exec(ctx, `INSERT INTO orders (order_id) VALUES ($1)`, orderID); err != nil {
		panic(err)
	}
	payment := pgrelay.Message{EventID: eventID, Topic: "orders", EventType: "OrderPaid",
		Payload: []byte(`{"order_id":"` + orderID + `","amount_cents":1999}`)}
	// Delivered twice, applied once.
	for range 2 {
		if _, err := pgrelay.Receive(ctx, pool, []pgrelay.Incoming{{Message: payment}}); err != nil {
			panic(err)
		}
	}
	var status string
	for deadline := time.Now().Add(30 * time.Second); status != "processed" && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		if err := pool.QueryRow(ctx, `SELECT status FROM pgrelay.inbox WHERE event_id = $1`, eventID).Scan(&status); err != nil {
			panic(err)
		}
	}
	stop()
	if err := <-done; err != nil {
		panic(err)
	}
	var credits, cents int64
	if err := pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(amount_cents), 0) FROM payments WHERE order_id = $1`,
		orderID).Scan(&credits, &cents); err != nil {
		panic(err)
	}
	fmt.Println(status+":", credits, "credit of", cents, "cents")
	// Output: processed: 1 credit of 1999 cents
}

// Receiving a batch from a broker: store it, then acknowledge. A message
// repeated in the batch (or already stored) is reported as a duplicate.
func ExampleReceive() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	paid := pgrelay.Message{EventID: uuid.NewString(), Topic: "orders", EventType: "OrderPaid",
		Payload: []byte(`{"order_id":"42","amount_cents":1999,"currency":"EUR"}`)}
	res, err := pgrelay.Receive(ctx, pool, []pgrelay.Incoming{{Message: paid}, {Message: paid}})
	var invalid *pgrelay.InvalidMessageError
	if errors.As(err, &invalid) {
		fmt.Println("refused:", invalid.Err)
		return
	}
	if err != nil {
		panic(err) // not stored: do not acknowledge, the broker redelivers
	}
	fmt.Println(res.Inserted, "stored,", len(res.Duplicates), "duplicate")

	_, err = pgrelay.Receive(ctx, pool, []pgrelay.Incoming{{Message: pgrelay.Message{Topic: "orders"}}})
	if errors.As(err, &invalid) {
		fmt.Println("refused message", invalid.Index, "-", invalid.Err)
	}
	// Output:
	// 1 stored, 1 duplicate
	// refused message 0 - event_id is required
}

// paymentsHandler credits payments one by one (Handle) or a whole batch in
// one statement (HandleBatch).
type paymentsHandler struct{}

func (paymentsHandler) Handle(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
	_, err := tx.Exec(ctx, `INSERT INTO payments (event_id, body) VALUES ($1, $2)`, ev.EventID, ev.Payload)
	return err
}

// HandleBatch writes every event's effect in one statement. Any error sends
// the batch through Handle, event by event, so it need not sort out which
// event failed.
func (paymentsHandler) HandleBatch(ctx context.Context, tx pgx.Tx, evs []*pgrelay.InboxEvent) error {
	ids, bodies := make([]string, len(evs)), make([][]byte, len(evs))
	for i, ev := range evs {
		ids[i], bodies[i] = ev.EventID, ev.Payload
	}
	_, err := tx.Exec(ctx, `INSERT INTO payments (event_id, body)
		SELECT unnest($1::text[]), unnest($2::bytea[])`, ids, bodies)
	return err
}

// A handler that also implements InboxBatchHandler applies each claimed batch
// in one call, marked processed with one statement.
func ExampleInboxBatchHandler() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		panic(err)
	}
	var handler pgrelay.InboxBatchHandler = paymentsHandler{}
	worker, err := pgrelay.NewInboxWorker(pgrelay.InboxConfig{Pool: pool, Handler: handler})
	if err != nil {
		panic(err)
	}
	runCtx, stop := context.WithTimeout(ctx, time.Second)
	defer stop()
	_ = worker.Run(runCtx)
}
