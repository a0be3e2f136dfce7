package consumer

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/rabbitmq"
	"github.com/pgrelay/pgrelay/internal/db"
	"github.com/pgrelay/pgrelay/internal/ledger"
	"github.com/pgrelay/pgrelay/internal/testamqp"
)

// TestRabbitMQRepublishAbsorbedByInbox: RabbitMQ has no dedup window, so a
// relay that re-publishes after a crash between publish and mark puts the
// same event on the queue twice. Every event is published twice through
// the RabbitMQ publisher, as such a relay would; the consumer, fed by the
// RabbitMQ subscriber, stores each event once (the inbox's unique event id
// absorbs the second copy) and the ledger credits each order once.
func TestRabbitMQRepublishAbsorbedByInbox(t *testing.T) {
	t.Parallel()
	b := setup(t)
	u := testamqp.URL(t)
	exchange, queue := testamqp.Names(t, u)
	rcfg := rabbitmq.Config{URL: u, Exchange: exchange, Queue: queue, Prefetch: 50,
		ReconnectWait: 50 * time.Millisecond, ReconnectMaxWait: time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var pub *rabbitmq.Publisher
	require.NoError(t, testamqp.Retry(time.Minute, func() (err error) { pub, err = rabbitmq.NewPublisher(ctx, rcfg); return err }))
	defer func() { _ = pub.Close() }()

	const orders = 20
	var msgs []pgrelay.Message
	var total int64
	at := time.Now().UTC()
	for i := range orders {
		order := fmt.Sprintf("o-%d", i)
		amount := int64(100 + i)
		total += amount
		created, err := json.Marshal(ledger.OrderCreated{OrderID: order, CustomerID: "c", AmountCents: amount, Currency: "EUR"})
		require.NoError(t, err)
		paid, err := json.Marshal(ledger.OrderPaid{OrderID: order, AmountCents: amount, Currency: "EUR"})
		require.NoError(t, err)
		msgs = append(msgs,
			pgrelay.Message{EventID: "created-" + order, Topic: "orders", Key: order, EventType: ledger.EventOrderCreated,
				ContentType: "application/json", Payload: created, OccurredAt: at},
			pgrelay.Message{EventID: "paid-" + order, Topic: "orders", Key: order, EventType: ledger.EventOrderPaid,
				ContentType: "application/json", Payload: paid, OccurredAt: at})
	}
	for range 2 { // the publish, then the re-publish
		require.NoError(t, testamqp.Retry(time.Minute, func() error {
			for _, r := range pub.Publish(ctx, msgs) {
				if r.Err != nil {
					return r.Err // retried whole: extra copies are absorbed too
				}
				require.False(t, r.Duplicate, "RabbitMQ reports no duplicates")
			}
			return nil
		}))
	}
	copies := testamqp.Count(t, u, queue)
	require.GreaterOrEqual(t, copies, 2*len(msgs), "the broker keeps both copies")

	cfg := b.cfg
	cfg.Subscribe = func(ctx context.Context) (broker.Subscriber, error) {
		var sub broker.Subscriber
		err := testamqp.Retry(time.Minute, func() (err error) {
			rcfg := rcfg
			rcfg.MaxPayloadBytes = DefaultMaxPayloadBytes
			sub, err = rabbitmq.NewSubscriber(ctx, rcfg)
			return err
		})
		return sub, err
	}
	c, err := newConsumer(cfg)
	require.NoError(t, err)
	stop := b.start(t, c)
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		tot, err := db.New().LedgerTotals(ctx, b.pool)
		if err != nil || tot.Entries != orders || tot.TotalCents != total {
			return false
		}
		var n, processed int
		if err := b.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE status = 'processed') FROM pgrelay.inbox`).Scan(&n, &processed); err != nil {
			return false
		}
		return n == len(msgs) && processed == n && c.Stats().Acked >= int64(copies)
	}, 30*time.Second, 50*time.Millisecond)
	require.NoError(t, stop())
	s := c.Stats()
	require.Equal(t, int64(len(msgs)), s.Inserted, "one inbox row per event")
	require.GreaterOrEqual(t, s.Duplicates, int64(len(msgs)), "every second copy absorbed by the inbox")
	require.Equal(t, 0, testamqp.Count(t, u, queue), "every copy acknowledged")

	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	var credits int
	require.NoError(t, b.pool.QueryRow(ctx2, `SELECT count(*) FROM ledger_entries`).Scan(&credits))
	require.Equal(t, orders, credits, "one effect per OrderPaid")
}
