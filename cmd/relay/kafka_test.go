package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// TestKafkaSettingsNameTheSetting: bad Kafka settings fail at start-up naming
// the flag and environment variable.
func TestKafkaSettingsNameTheSetting(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	t.Setenv("KAFKA_BROKERS", "")
	ctx := context.Background()
	run := []string{"run", "--database-url", "postgres://x", "--broker", "kafka"}
	require.ErrorContains(t, execute(ctx, run...), "--kafka-brokers (KAFKA_BROKERS) is required")
	require.ErrorContains(t, execute(ctx, append(run, "--kafka-brokers", "nohost")...), `--kafka-brokers (KAFKA_BROKERS): "nohost" is not host:port`)
	require.ErrorContains(t, execute(ctx, append(run, "--kafka-brokers", "h:9092", "--kafka-max-message-bytes", "10")...), "--kafka-max-message-bytes (KAFKA_MAX_MESSAGE_BYTES)")
	require.ErrorContains(t, execute(ctx, append(run, "--kafka-brokers", "h:9092", "--kafka-topic-prefix", "a b")...), "--kafka-topic-prefix (KAFKA_TOPIC_PREFIX)")
	t.Setenv("KAFKA_DELIVERY_TIMEOUT", "soon")
	require.ErrorContains(t, execute(ctx, append(run, "--kafka-brokers", "h:9092")...), `invalid KAFKA_DELIVERY_TIMEOUT="soon"`)
}

// TestRunWithKafka: `relay run --broker kafka` publishes an outbox row to the
// Kafka topic <prefix>.<topic>, keyed by the row's key, with its event id.
func TestRunWithKafka(t *testing.T) {
	pool := testdb.New(t)
	url := pool.Config().ConnString()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "shop.orders"))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- execute(ctx, "run", "--database-url", url, "--broker", "kafka", "--kafka-brokers", c.ListenAddrs()[0],
			"--kafka-topic-prefix", "shop", "--lease", "2s", "--poll-interval", "100ms", "--log-level", "warn",
			"--metrics-addr", "127.0.0.1:0", "--admin-addr", "")
	}()
	_, err = pool.Exec(context.Background(), `INSERT INTO pgrelay.outbox (event_id, topic, key, payload) VALUES ('evt-k1', 'orders', 'order-7', 'x')`)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var n int
		_ = pool.QueryRow(context.Background(), `SELECT count(*) FROM pgrelay.outbox WHERE status = 'published'`).Scan(&n)
		return n == 1
	}, 20*time.Second, 20*time.Millisecond)
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("relay did not stop")
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("shop.orders"))
	require.NoError(t, err)
	defer cl.Close()
	fctx, fcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer fcancel()
	fs := cl.PollRecords(fctx, 10)
	require.NoError(t, fs.Err())
	recs := fs.Records()
	require.Len(t, recs, 1)
	require.Equal(t, "order-7", string(recs[0].Key))
	var id string
	for _, h := range recs[0].Headers {
		if h.Key == event.HeaderEventID {
			id = string(h.Value)
		}
	}
	require.Equal(t, "evt-k1", id)
}
