package kafka_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/brokertest"
	"github.com/pgrelay/pgrelay/broker/kafka"
	"github.com/pgrelay/pgrelay/consumer"
	"github.com/pgrelay/pgrelay/internal/ledger"
	"github.com/pgrelay/pgrelay/internal/logtest"
	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/relay"
)

// TestEndToEndThroughKafka: OrderCreated/OrderPaid events committed to the
// outbox travel relay → Kafka → consumer → inbox → ledger, while a second
// consumer joins the group mid-stream (a rebalance). Every order is credited
// exactly once (an OrderPaid before its OrderCreated would fail: per-key
// order holds), whatever the rebalance redelivered.
func TestEndToEndThroughKafka(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	brokers := kafkaBrokers(t)
	ns := brokertest.Namespace("e2e")
	createTopic(t, brokers, ns+".orders", 4)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	log := logtest.NewAt(t, slog.LevelWarn)
	cfg := kafka.Config{Brokers: brokers, TopicPrefix: ns, Group: ns, SessionTimeout: 6 * time.Second,
		CommitInterval: 50 * time.Millisecond, MetadataMaxAge: time.Second, Logger: log}

	pub, err := kafka.NewPublisher(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	r, err := relay.New(relay.Config{Pool: pool, Publisher: pub, PollInterval: 20 * time.Millisecond, Logger: log})
	require.NoError(t, err)
	newConsumer := func() *consumer.Consumer {
		c, err := consumer.New(consumer.Config{
			Pool: pool, FetchBatchSize: 20, MaxWait: 100 * time.Millisecond, StatsInterval: -1,
			RetryMin: 10 * time.Millisecond, RetryMax: 200 * time.Millisecond,
			Subscribe: func(ctx context.Context) (broker.Subscriber, error) { return kafka.NewSubscriber(ctx, cfg) },
			Inbox: pgrelay.InboxConfig{Handler: ledger.Handler{}, PollInterval: 50 * time.Millisecond,
				BackoffMin: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond},
			Logger: log,
		})
		require.NoError(t, err)
		return c
	}

	ob, err := pgrelay.NewOutbox(pgrelay.OutboxConfig{})
	require.NoError(t, err)
	const orders = 150
	var total int64
	enqueue := func(from, to int) {
		for i := from; i < to; i++ {
			order := fmt.Sprintf("o-%d", i)
			amount := int64(100 + i)
			total += amount
			created, _ := json.Marshal(ledger.OrderCreated{OrderID: order, CustomerID: "c", AmountCents: amount, Currency: "EUR"})
			paid, _ := json.Marshal(ledger.OrderPaid{OrderID: order, AmountCents: amount, Currency: "EUR"})
			require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				return ob.Enqueue(ctx, tx,
					pgrelay.Message{EventID: "created-" + order, Topic: "orders", Key: order, EventType: ledger.EventOrderCreated, Payload: created},
					pgrelay.Message{EventID: "paid-" + order, Topic: "orders", Key: order, EventType: ledger.EventOrderPaid, Payload: paid})
			}))
		}
	}

	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	wg.Go(func() { _ = r.Run(runCtx) })
	wg.Go(func() { require.NoError(t, newConsumer().Run(runCtx)) })
	enqueue(0, orders/2)
	// The second member joins while the first is consuming.
	wg.Go(func() { require.NoError(t, newConsumer().Run(runCtx)) })
	enqueue(orders/2, orders)

	require.Eventually(t, func() bool {
		var n int
		var sum int64
		_ = pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(amount_cents), 0) FROM ledger_entries`).Scan(&n, &sum)
		return n == orders && sum == total
	}, 90*time.Second, 50*time.Millisecond, "every order credited once")
	var dead, notDone int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'dead'), count(*) FILTER (WHERE status <> 'processed') FROM pgrelay.inbox`).Scan(&dead, &notDone))
	require.Zero(t, dead, "no event dead (an OrderPaid ahead of its OrderCreated would be)")
	require.Zero(t, notDone)
}

// kafkaBrokers returns KAFKA_BROKERS, or the address of a kfake cluster
// closed when the test ends.
func kafkaBrokers(t *testing.T) []string {
	if v := strings.TrimSpace(os.Getenv("KAFKA_BROKERS")); v != "" {
		return strings.Split(v, ",")
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

func createTopic(t *testing.T, brokers []string, topic string, partitions int32) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	require.NoError(t, err)
	defer cl.Close()
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = topic, partitions, -1
	req.Topics, req.TimeoutMillis = append(req.Topics, rt), 10000
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, cl)
	require.NoError(t, err)
	require.Zero(t, resp.Topics[0].ErrorCode, "create topic %s", topic)
}
