package consumer_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/rabbitmq"
	"github.com/pgrelay/pgrelay/consumer"
	"github.com/pgrelay/pgrelay/internal/testamqp"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// TestConsumerOnRabbitMQ: the public consumer runs on RabbitMQ through
// SubscribeRabbitMQ; events published twice (as a relay re-publishing after
// a crash would) are applied once each.
func TestConsumerOnRabbitMQ(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	u := testamqp.URL(t)
	exchange, queue := testamqp.Names(t, u)
	cfg := rabbitmq.Config{URL: u, Exchange: exchange, Queue: queue}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := pool.Exec(ctx, `CREATE TABLE applied (event_id text PRIMARY KEY, times int NOT NULL)`)
	require.NoError(t, err)

	var pub *rabbitmq.Publisher
	require.NoError(t, testamqp.Retry(time.Minute, func() (err error) { pub, err = rabbitmq.NewPublisher(ctx, cfg); return err }))
	defer func() { _ = pub.Close() }()
	var msgs []pgrelay.Message
	for i := range 10 {
		msgs = append(msgs, pgrelay.Message{EventID: fmt.Sprintf("r-%d", i), Topic: "orders", Key: "k",
			EventType: "OrderCreated", Payload: []byte(`{}`), OccurredAt: time.Now()})
	}
	for range 2 { // the publish, then the re-publish
		require.NoError(t, testamqp.Retry(time.Minute, func() error {
			for _, r := range pub.Publish(ctx, msgs) {
				if r.Err != nil {
					return r.Err
				}
			}
			return nil
		}))
	}
	copies := testamqp.Count(t, u, queue)
	cfg.MaxPayloadBytes = 1 << 20
	subscribe := broker.Subscribe(rabbitmq.NewSubscriber, cfg)

	c, err := consumer.New(consumer.Config{Pool: pool, Inbox: pgrelay.InboxConfig{Handler: &countingBatchHandler{}},
		MaxWait: 50 * time.Millisecond, Logger: testLogger(t),
		Subscribe: func(ctx context.Context) (sub broker.Subscriber, err error) {
			err = testamqp.Retry(time.Minute, func() error { sub, err = subscribe(ctx); return err })
			return sub, err
		}})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { require.NoError(t, c.Run(runCtx)) })
	defer func() { stop(); wg.Wait() }()
	require.Eventually(t, func() bool {
		return c.Stats().Duplicates >= int64(len(msgs)) && c.Stats().Acked >= int64(copies)
	}, 30*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM applied`).Scan(&n)
		return n == len(msgs)
	}, 30*time.Second, 20*time.Millisecond)
	var maxTimes int
	require.NoError(t, pool.QueryRow(ctx, `SELECT max(times) FROM applied`).Scan(&maxTimes))
	require.Equal(t, 1, maxTimes, "each event applied once")
}
