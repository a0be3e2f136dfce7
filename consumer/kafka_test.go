package consumer_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/kafka"
	"github.com/pgrelay/pgrelay/consumer"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// TestConsumerFromKafka: consumer.New fetching from
// broker.Subscribe(kafka.NewSubscriber, ...) applies each event once.
func TestConsumerFromKafka(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "shop.orders"))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = pool.Exec(ctx, `CREATE TABLE applied (event_id text PRIMARY KEY, times int NOT NULL)`)
	require.NoError(t, err)

	pub, err := kafka.NewPublisher(ctx, kafka.Config{Brokers: c.ListenAddrs(), TopicPrefix: "shop"})
	require.NoError(t, err)
	defer pub.Close()
	var msgs []pgrelay.Message
	for i := range 5 {
		msgs = append(msgs, pgrelay.Message{EventID: fmt.Sprintf("k-%d", i), Topic: "orders", Key: "k",
			EventType: "OrderCreated", Payload: []byte(`{}`)})
	}
	for _, r := range pub.Publish(ctx, msgs) {
		require.NoError(t, r.Err)
	}

	cons, err := consumer.New(consumer.Config{Pool: pool, Inbox: pgrelay.InboxConfig{Handler: &countingBatchHandler{}},
		MaxWait: 50 * time.Millisecond, Logger: testLogger(t),
		Subscribe: broker.Subscribe(kafka.NewSubscriber, kafka.Config{Brokers: c.ListenAddrs(), TopicPrefix: "shop", Group: "billing"})})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { require.NoError(t, cons.Run(runCtx)) })
	defer func() { stop(); wg.Wait() }()
	require.Eventually(t, func() bool {
		var n, most int
		_ = pool.QueryRow(ctx, `SELECT count(*), coalesce(max(times), 0) FROM applied`).Scan(&n, &most)
		return n == 5 && most == 1
	}, 30*time.Second, 20*time.Millisecond)
}
