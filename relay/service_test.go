package relay_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/nats"
	"github.com/pgrelay/pgrelay/relay"
)

// TestConfigErrorsNameTheField: every bad setting is reported at once, each
// naming its relay.Config field, never a command-line flag.
func TestConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	_, err := relay.New(relay.Config{})
	require.ErrorContains(t, err, "relay.Config.Pool is required")

	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none")
	require.NoError(t, err)
	defer pool.Close()
	_, err = relay.New(relay.Config{Pool: pool, Publisher: nopPublisher{}, Lease: time.Millisecond,
		MetricsAddr: "nonsense", AdminAddr: "0.0.0.0:9190", AdminToken: "short"})
	require.ErrorContains(t, err, "relay.Config.Lease must be at least 100ms")
	require.ErrorContains(t, err, `relay.Config.MetricsAddr "nonsense"`)
	require.ErrorContains(t, err, "relay.Config.AdminToken must be at least 16 characters")
	require.NotContains(t, err.Error(), "--", "no command-line flag named to a library user")
	require.False(t, strings.Contains(err.Error(), " Config."), "every field is relay.Config's: %v", err)
}

// nopPublisher publishes nothing, for checks that never publish.
type nopPublisher struct{}

func (nopPublisher) Publish(context.Context, []pgrelay.Message) []broker.Result { return nil }
func (nopPublisher) Close() error                                               { return nil }

// ExampleNew relays an event enqueued in the application's transaction to
// NATS JetStream: the whole of a relay's main function, with a JetStream
// consumer in place of the consumer service.
func ExampleNew() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	suffix := fmt.Sprint(time.Now().UnixNano())
	pub, err := nats.NewPublisher(ctx, nats.Config{
		URL:           os.Getenv("NATS_URL"),
		Stream:        "RELAY_EXAMPLE_" + suffix, // default "PGRELAY"
		SubjectPrefix: "relayexample" + suffix,   // default "pgrelay"
		CreateStream:  true,
	})
	if err != nil {
		panic(err)
	}
	defer pub.Close()
	r, err := relay.New(relay.Config{Pool: pool, Publisher: pub, PollInterval: 50 * time.Millisecond})
	if err != nil {
		panic(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()

	// The application's part: an event committed with its own write.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return pgrelay.Enqueue(ctx, tx, pgrelay.Message{Topic: "orders", Key: "order-1", EventType: "OrderCreated",
			Payload: []byte(`{"order_id":"order-1"}`)})
	})
	if err != nil {
		panic(err)
	}

	nc, err := natsgo.Connect(os.Getenv("NATS_URL"))
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	c, err := js.OrderedConsumer(ctx, "RELAY_EXAMPLE_"+suffix, jetstream.OrderedConsumerConfig{})
	if err != nil {
		panic(err)
	}
	msg, err := c.Next(jetstream.FetchMaxWait(30 * time.Second))
	if err != nil {
		panic(err)
	}
	fmt.Println(strings.TrimPrefix(msg.Subject(), "relayexample"+suffix+"."), msg.Headers().Get("Pgrelay-Event-Type"), string(msg.Data()))
	cancel()
	fmt.Println("stopped:", <-done)
	// Output:
	// orders OrderCreated {"order_id":"order-1"}
	// stopped: <nil>
}
