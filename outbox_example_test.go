package pgrelay_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay"
)

// Writing an event in the same transaction as the business row: the relay
// publishes it if and only if the transaction commits.
func ExampleEnqueue() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	orderID := uuid.NewString()
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (order_id) VALUES ($1)`, orderID); err != nil {
			return err
		}
		return pgrelay.Enqueue(ctx, tx, pgrelay.Message{
			Topic:      "orders",
			Key:        orderID, // events of one order are published in commit order
			EventType:  "OrderCreated",
			Payload:    []byte(`{"order_id":"` + orderID + `"}`),
			OccurredAt: time.Date(2026, 11, 22, 10, 0, 0, 123456789, time.UTC), // stored to the microsecond
		})
	})
	if err != nil {
		panic(err)
	}
	var status string
	var occurred time.Time
	if err := pool.QueryRow(ctx, `SELECT status, occurred_at FROM pgrelay.outbox WHERE key = $1`, orderID).
		Scan(&status, &occurred); err != nil {
		panic(err)
	}
	fmt.Println(status, occurred.UTC().Format(time.RFC3339Nano))

	// Invalid messages are refused before anything is written.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return pgrelay.Enqueue(ctx, tx, pgrelay.Message{Topic: "orders",
			OccurredAt: time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC)})
	})
	fmt.Println(errors.Is(err, pgrelay.ErrOccurredAtOutOfRange))
	// Output:
	// pending 2026-11-22T10:00:00.123457Z
	// true
}
