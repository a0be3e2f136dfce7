package consumer_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	pgnats "github.com/pgrelay/pgrelay/broker/nats"
	"github.com/pgrelay/pgrelay/consumer"
)

// ExampleNew runs a consumer with the application's own handler: the
// whole of a consumer's main function. The relay would publish the events; here
// the example publishes one itself, twice, as a broker redelivery would.
func ExampleNew() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	suffix := randomSuffix()
	c, err := consumer.New(consumer.Config{
		Pool: pool,
		Subscribe: broker.Subscribe(pgnats.NewSubscriber, pgnats.Config{
			URL:           os.Getenv("NATS_URL"),
			Stream:        "EXAMPLE_" + suffix, // default "PGRELAY", the relay's
			SubjectPrefix: "example" + suffix,  // default "pgrelay"
			CreateStream:  true,
		}),
		Inbox: pgrelay.InboxConfig{
			Handler: pgrelay.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
				_, err := tx.Exec(ctx, `INSERT INTO orders (order_id) VALUES ($1)`, ev.Key)
				return err
			}),
		},
	})
	if err != nil {
		panic(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()

	// The relay's part: one event, delivered twice under new broker ids.
	nc, err := nats.Connect(os.Getenv("NATS_URL"))
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	for i := range 2 {
		m := nats.NewMsg("example" + suffix + ".orders")
		m.Header.Set("Nats-Msg-Id", fmt.Sprintf("delivery-%d", i))
		m.Header.Set("Pgrelay-Event-Id", "evt-"+suffix)
		m.Header.Set("Pgrelay-Event-Type", "OrderCreated")
		m.Header.Set("Pgrelay-Key", "order-"+suffix)
		m.Data = []byte(`{}`)
		for ctx.Err() == nil {
			if _, err := js.PublishMsg(ctx, m); err == nil {
				break // the consumer creates the stream as it attaches
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	for ctx.Err() == nil && (c.Stats().Duplicates < 1 || countProcessed(ctx, pool, "evt-"+suffix) < 1) {
		time.Sleep(20 * time.Millisecond)
	}
	var orders int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE order_id = $1`, "order-"+suffix).Scan(&orders)
	fmt.Println("deliveries:", c.Stats().Fetched, "duplicates:", c.Stats().Duplicates, "orders written:", orders)
	cancel()
	fmt.Println("stopped:", <-done)
	// Output:
	// deliveries: 2 duplicates: 1 orders written: 1
	// stopped: <nil>
}

func countProcessed(ctx context.Context, pool *pgxpool.Pool, eventID string) int {
	var n int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM pgrelay.inbox WHERE event_id = $1 AND status = 'processed'`, eventID).Scan(&n)
	return n
}

func randomSuffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
