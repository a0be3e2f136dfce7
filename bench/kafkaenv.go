package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/kafka"
	"github.com/pgrelay/pgrelay/internal/logbridge"
)

// kafkaPartitions is the partition count of the run's topics.
const kafkaPartitions = 16

// kafkaEnv is the Kafka cluster of a -broker kafka run: an external one
// (-kafka-brokers / KAFKA_BROKERS) or kfake, franz-go's in-process Kafka,
// started for the run. kfake keeps records in memory and answers in-process:
// its figures are the relay's and the client's cost, not a Kafka cluster's.
type kafkaEnv struct {
	brokers []string
	where   string
	fake    *kfake.Cluster
	cl      *kgo.Client
	log     *slog.Logger
}

func startKafka(brokers []string, log *slog.Logger) (*kafkaEnv, error) {
	e := &kafkaEnv{brokers: brokers, where: "external " + strings.Join(brokers, ","), log: log}
	if len(brokers) == 0 {
		c, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			return nil, fmt.Errorf("kfake: %w", err)
		}
		e.fake, e.brokers, e.where = c, c.ListenAddrs(), "kfake in-process (franz-go's fake Kafka, in memory)"
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...))
	if err != nil {
		e.close()
		return nil, fmt.Errorf("kafka client (-kafka-brokers): %w", err)
	}
	e.cl = cl
	return e, nil
}

// topic creates a fresh topic prefix with its "orders" topic and returns the
// prefix.
func (e *kafkaEnv) topic(ctx context.Context) (string, error) {
	prefix := "pgrelaybench" + randomHex(5)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req := kmsg.NewPtrCreateTopicsRequest()
	t := kmsg.NewCreateTopicsRequestTopic()
	t.Topic, t.NumPartitions, t.ReplicationFactor = prefix+".orders", kafkaPartitions, -1
	req.Topics, req.TimeoutMillis = append(req.Topics, t), 20000
	resp, err := req.RequestWith(ctx, e.cl)
	if err != nil {
		return "", fmt.Errorf("create Kafka topic: %w", err)
	}
	for _, rt := range resp.Topics {
		if err := kerr.ErrorForCode(rt.ErrorCode); err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
			return "", fmt.Errorf("create Kafka topic %s: %w", rt.Topic, err)
		}
	}
	return prefix, nil
}

// publisher returns a publisher for the topics of prefix.
func (e *kafkaEnv) publisher(ctx context.Context, prefix string) (broker.Publisher, error) {
	return kafka.NewPublisher(ctx, kafka.Config{Brokers: e.brokers, TopicPrefix: prefix,
		Logger: logbridge.AtLeast(e.log.With(slog.String("logger", "kafka")), slog.LevelError)})
}

// records returns how many records the "orders" topic of prefix holds (the
// sum of its partitions' end offsets).
func (e *kafkaEnv) records(ctx context.Context, prefix string) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req := kmsg.NewPtrListOffsetsRequest()
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = prefix + ".orders"
	for p := range int32(kafkaPartitions) {
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition, rp.Timestamp = p, -1 // the end offset
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	var total int64
	for _, shard := range e.cl.RequestSharded(ctx, req) {
		if shard.Err != nil {
			return 0, shard.Err
		}
		for _, t := range shard.Resp.(*kmsg.ListOffsetsResponse).Topics {
			for _, p := range t.Partitions {
				if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
					return 0, fmt.Errorf("list offsets %s/%d: %w", t.Topic, p.Partition, err)
				}
				total += p.Offset
			}
		}
	}
	return total, nil
}

// dropTopic deletes the "orders" topic of prefix.
func (e *kafkaEnv) dropTopic(prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := kmsg.NewPtrDeleteTopicsRequest()
	t := kmsg.NewDeleteTopicsRequestTopic()
	name := prefix + ".orders"
	t.Topic = &name
	req.Topics, req.TopicNames, req.TimeoutMillis = append(req.Topics, t), []string{name}, 10000
	if _, err := req.RequestWith(ctx, e.cl); err != nil {
		e.log.Warn("delete Kafka topic", slog.String("topic", name), slog.Any("error", err))
	}
}

func (e *kafkaEnv) close() {
	if e.cl != nil {
		e.cl.Close()
	}
	if e.fake != nil {
		e.fake.Close()
	}
}

// kafkaTarget is a fresh topic prefix with its "orders" topic.
type kafkaTarget struct {
	e      *kafkaEnv
	prefix string
}

func newKafkaTarget(ctx context.Context, b *bench) (relayTarget, error) {
	prefix, err := b.kafka.topic(ctx)
	if err != nil {
		return nil, err
	}
	return &kafkaTarget{e: b.kafka, prefix: prefix}, nil
}

func (t *kafkaTarget) newPublisher(ctx context.Context) (broker.Publisher, error) {
	return t.e.publisher(ctx, t.prefix)
}

func (t *kafkaTarget) stored(ctx context.Context) (uint64, error) {
	n, err := t.e.records(ctx, t.prefix)
	if err != nil {
		return 0, fmt.Errorf("kafka offsets: %w", err)
	}
	return uint64(n), nil
}

func (t *kafkaTarget) drop() { t.e.dropTopic(t.prefix) }
