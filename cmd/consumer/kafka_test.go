package main

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker/kafka"
	"github.com/pgrelay/pgrelay/internal/ledger"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// TestKafkaSettingsNameTheSetting: bad Kafka settings stop the consumer at
// start-up naming the flag or variable.
func TestKafkaSettingsNameTheSetting(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://127.0.0.1:1/none")
	t.Setenv("KAFKA_BROKERS", "")
	require.ErrorContains(t, run(t, "run", "--broker", "kafka"), "--kafka-brokers (KAFKA_BROKERS) is required")
	require.ErrorContains(t, run(t, "run", "--broker", "kafka", "--kafka-brokers", "h:9092", "--kafka-group", " g"), "--kafka-group (KAFKA_GROUP)")
	require.ErrorContains(t, run(t, "run", "--broker", "kafka", "--kafka-brokers", "h:9092", "--kafka-topics", "a b"), "--kafka-topics (KAFKA_TOPICS)")
	t.Setenv("KAFKA_SESSION_TIMEOUT", "long")
	require.ErrorContains(t, run(t, "run", "--broker", "kafka", "--kafka-brokers", "h:9092"), `invalid KAFKA_SESSION_TIMEOUT="long"`)
}

// TestRunWithKafka: `consumer run --broker kafka` stores what the relay's
// Kafka publisher sent in the inbox and the ledger applies it, each event
// once although every event is published twice.
func TestRunWithKafka(t *testing.T) {
	dbURL := testdb.NewURL(t)
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "shop.orders"))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	brokers := c.ListenAddrs()[0]
	startConsumerCommand(t, "run", "--database-url", dbURL, "--broker", "kafka", "--kafka-brokers", brokers,
		"--kafka-topic-prefix", "shop", "--kafka-group", "ledger", "--metrics-addr", "", "--admin-addr", "",
		"--log-level", "error", "--max-wait", "100ms")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pub, err := kafka.NewPublisher(ctx, kafka.Config{Brokers: []string{brokers}, TopicPrefix: "shop"})
	require.NoError(t, err)
	defer pub.Close()
	var msgs []pgrelay.Message
	for i := range 5 {
		order := fmt.Sprintf("o-%d", i)
		payload, _ := json.Marshal(ledger.OrderCreated{OrderID: order, CustomerID: "c", AmountCents: 100, Currency: "EUR"})
		msgs = append(msgs, pgrelay.Message{EventID: "created-" + order, Topic: "orders", Key: order,
			EventType: ledger.EventOrderCreated, Payload: payload, ContentType: "application/json"})
	}
	for range 2 {
		for i, r := range pub.Publish(ctx, msgs) {
			require.NoError(t, r.Err, msgs[i].EventID)
		}
	}
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	defer pool.Close()
	require.Eventually(t, func() bool {
		var processed, orders int
		_ = pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM pgrelay.inbox WHERE status = 'processed'), (SELECT count(*) FROM ledger_orders)`).Scan(&processed, &orders)
		return processed == 5 && orders == 5
	}, time.Minute, 50*time.Millisecond, "the consumer never processed the 5 events")
}
