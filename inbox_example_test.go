package pgrelay_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay"
)

// An inbox handler crediting payments: its insert commits in the same
// transaction as the event's processed mark, so it happens exactly once per
// event however often the broker delivers it.
func ExampleNewInboxWorker() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		panic(err)
	}
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
	worker, err := pgrelay.NewInboxWorker(pgrelay.InboxConfig{Pool: pool, Handler: handler})
	if err != nil {
		panic(err)
	}
	runCtx, stop := context.WithTimeout(ctx, time.Second)
	defer stop()
	_ = worker.Run(runCtx) // blocks until the context ends
}

// Receiving a batch from a broker: store it, then acknowledge.
func ExampleReceive() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		panic(err)
	}
	res, err := pgrelay.Receive(ctx, pool, []pgrelay.Incoming{
		{Message: pgrelay.Message{EventID: "0190d7a2-0001", Topic: "orders", EventType: "OrderPaid",
			Payload: []byte(`{"order_id":"42","amount_cents":1999,"currency":"EUR"}`)}},
	})
	var invalid *pgrelay.InvalidMessageError
	if errors.As(err, &invalid) {
		fmt.Println("refused:", invalid.Err)
		return
	}
	if err != nil {
		panic(err) // not stored: do not acknowledge, the broker redelivers
	}
	fmt.Println(res.Inserted, "stored,", len(res.Duplicates), "duplicates")
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
