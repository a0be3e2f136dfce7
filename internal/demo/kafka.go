package demo

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgrelay/pgrelay/internal/event"
)

// kafkaPartitions is the partition count of the run's topic.
const kafkaPartitions = 4

// kafkaBroker is kfake, franz-go's in-memory Kafka, started in the demo's
// process and listening on loopback, with a topic of the run's own
// (<prefix>.orders). The services reach it over TCP like any Kafka cluster.
type kafkaBroker struct {
	fake    *kfake.Cluster
	brokers []string
	prefix  string
	cl      *kgo.Client
}

func startKafkaBroker(ctx context.Context, say func(string, ...any)) (*kafkaBroker, error) {
	fake, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		return nil, fmt.Errorf("demo: start kfake: %w", err)
	}
	b := &kafkaBroker{fake: fake, brokers: fake.ListenAddrs(), prefix: "pgrelaydemo" + randomHex(4)}
	if b.cl, err = kgo.NewClient(kgo.SeedBrokers(b.brokers...)); err != nil {
		b.close()
		return nil, fmt.Errorf("demo: Kafka client: %w", err)
	}
	// The topic, keeping records for a day: less than the consumer's dedup
	// window, as the consumer requires.
	req := kmsg.NewPtrCreateTopicsRequest()
	t := kmsg.NewCreateTopicsRequestTopic()
	t.Topic, t.NumPartitions, t.ReplicationFactor = b.prefix+".orders", kafkaPartitions, -1
	c := kmsg.NewCreateTopicsRequestTopicConfig()
	c.Name, c.Value = "retention.ms", kmsg.StringPtr(strconv.Itoa(int((24 * time.Hour).Milliseconds())))
	t.Configs = append(t.Configs, c)
	req.Topics, req.TimeoutMillis = append(req.Topics, t), 20000
	resp, err := req.RequestWith(ctx, b.cl)
	if err == nil {
		for _, rt := range resp.Topics {
			if e := kerr.ErrorForCode(rt.ErrorCode); e != nil && !errors.Is(e, kerr.TopicAlreadyExists) {
				err = e
			}
		}
	}
	if err != nil {
		b.close()
		return nil, fmt.Errorf("demo: create Kafka topic %s.orders: %w", b.prefix, err)
	}
	say("kfake (franz-go's in-memory Kafka) listening on %s: topic %s.orders, %d partitions", strings.Join(b.brokers, ","), b.prefix, kafkaPartitions)
	return b, nil
}

func (b *kafkaBroker) serviceEnv() (relay, consumer []string) {
	common := []string{"PGRELAY_BROKER=kafka", "KAFKA_BROKERS=" + strings.Join(b.brokers, ","), "KAFKA_TOPIC_PREFIX=" + b.prefix}
	return common, append(common, "KAFKA_GROUP=demo", "KAFKA_SESSION_TIMEOUT=6s")
}

// publish produces a record as the relay does (the event's key as the record
// key, pgrelay's headers as record headers). Kafka has no broker message id
// and no dedup: msgID is not sent, and nothing is dropped.
func (b *kafkaBroker) publish(ctx context.Context, eventID, _, eventType string, payload []byte, key string) (bool, error) {
	h := []kgo.RecordHeader{
		{Key: event.HeaderTopic, Value: []byte("orders")},
		{Key: event.HeaderOccurredAt, Value: []byte(time.Now().UTC().Format(time.RFC3339Nano))},
	}
	if eventID != "" {
		h = append(h, kgo.RecordHeader{Key: event.HeaderEventID, Value: []byte(eventID)})
	}
	if eventType != "" {
		h = append(h, kgo.RecordHeader{Key: event.HeaderEventType, Value: []byte(eventType)})
	}
	if key != "" {
		h = append(h, kgo.RecordHeader{Key: event.HeaderKey, Value: []byte(key)})
	}
	rec := &kgo.Record{Topic: b.prefix + ".orders", Key: []byte(key), Value: payload, Headers: h}
	if err := b.cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
		return false, fmt.Errorf("demo: produce to Kafka: %w", err)
	}
	return false, nil
}

// stored counts the topic's records: the sum of its partitions' end offsets.
func (b *kafkaBroker) stored(ctx context.Context) (int64, error) {
	req := kmsg.NewPtrListOffsetsRequest()
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = b.prefix + ".orders"
	for p := range int32(kafkaPartitions) {
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition, rp.Timestamp = p, -1 // the end offset
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	var total int64
	for _, shard := range b.cl.RequestSharded(ctx, req) {
		if shard.Err != nil {
			return 0, shard.Err
		}
		for _, t := range shard.Resp.(*kmsg.ListOffsetsResponse).Topics {
			for _, p := range t.Partitions {
				if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
					return 0, fmt.Errorf("demo: Kafka offsets %s/%d: %w", t.Topic, p.Partition, err)
				}
				total += p.Offset
			}
		}
	}
	return total, nil
}

func (b *kafkaBroker) dedupName() string { return "" }

func (b *kafkaBroker) close() {
	if b.cl != nil {
		b.cl.Close()
	}
	b.fake.Close()
}
