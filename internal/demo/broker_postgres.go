package demo

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/postgres"
)

// BrokerPostgres runs the demo with PostgreSQL as the broker: the relay
// stores into the demo database's own inbox.
const BrokerPostgres = "postgres"

// postgresBroker is PostgreSQL as the broker: the relay stores events
// straight into the demo database's inbox; the consumer runs its workers
// without a subscriber. Injected messages go through the same publisher,
// except the malformed ones a subscriber would store dead (no event id, a
// payload over the consumer's limit): those are stored dead as it would.
type postgresBroker struct {
	pool *pgxpool.Pool
	pub  *postgres.Publisher
	// absorbed counts injected messages the inbox already held.
	absorbed int64
}

// demoMaxPayload is CONSUMER_MAX_PAYLOAD_BYTES of the demo's consumer.
const demoMaxPayload = 65536

func startPostgresBroker(ctx context.Context, pool *pgxpool.Pool, say func(string, ...any)) (*postgresBroker, error) {
	pub, err := postgres.NewPublisher(ctx, postgres.Config{Pool: pool})
	if err != nil {
		return nil, fmt.Errorf("demo: PostgreSQL as the broker: %w", err)
	}
	// The consumer registers its handler when it starts; registering it here
	// too lets the injected messages in before that.
	if err := postgres.Register(ctx, pool, postgres.Subscription{Handler: pgrelay.DefaultHandlerName}); err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	say("using PostgreSQL as the broker: the relay stores into the demo database's inbox")
	return &postgresBroker{pool: pool, pub: pub}, nil
}

func (b *postgresBroker) serviceEnv() (relay, consumer []string) {
	return []string{"PGRELAY_BROKER=postgres"}, []string{"PGRELAY_BROKER=postgres"}
}

func (b *postgresBroker) publish(ctx context.Context, eventID, _, eventType string, payload []byte, key string) (bool, error) {
	m := pgrelay.Message{EventID: eventID, Topic: "orders", Key: key, EventType: eventType, Payload: payload, OccurredAt: time.Now()}
	dead := ""
	switch {
	case eventID == "":
		m.EventID, dead = uuid.NewString(), broker.ReasonMissingEventID
	case len(payload) > demoMaxPayload:
		dead = fmt.Sprintf("%s: %d bytes, over %d", broker.ReasonPayloadTooLarge, len(payload), demoMaxPayload)
	}
	if dead != "" {
		_, err := pgrelay.Receive(ctx, b.pool, []pgrelay.Incoming{{Message: m, DeadReason: dead}})
		return false, err
	}
	r := b.pub.Publish(ctx, []pgrelay.Message{m})[0]
	if r.Err != nil {
		return false, fmt.Errorf("demo: store into the inbox: %w", r.Err)
	}
	if r.Duplicate {
		b.absorbed++
	}
	return false, nil
}

// stored counts what reached the inbox: its rows, and the injected
// duplicates it absorbed.
func (b *postgresBroker) stored(ctx context.Context) (int64, error) {
	var n int64
	err := b.pool.QueryRow(ctx, `SELECT pg_catalog.count(*) FROM pgrelay.inbox WHERE handler = $1`, pgrelay.DefaultHandlerName).Scan(&n)
	return n + b.absorbed, err
}

func (b *postgresBroker) dedupName() string { return "" }

func (b *postgresBroker) close() { _ = b.pub.Close() }
