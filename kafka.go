package pgrelay

import (
	"context"

	"github.com/pgrelay/pgrelay/internal/broker/kafka"
)

// KafkaConfig configures a Kafka subscriber: seed brokers, the topic prefix
// (an event of topic "orders" is in Kafka topic "<TopicPrefix>.orders"), the
// consumer group and its limits. Every field documents its default.
type KafkaConfig = kafka.Config

// NewKafkaSubscriber joins the consumer group cfg.Group on the pgrelay topics
// and returns it as a Subscriber, for ConsumerConfig.Subscribe:
//
//	cfg.Subscribe = func(ctx context.Context) (pgrelay.Subscriber, error) {
//		return pgrelay.NewKafkaSubscriber(ctx, pgrelay.KafkaConfig{Brokers: []string{"kafka:9092"}, Group: "billing"})
//	}
//
// A partition's offset is committed only over the records the inbox stored
// (acknowledged), in order; a rebalance hands what was not stored to the new
// owner, and the inbox absorbs what comes twice.
func NewKafkaSubscriber(ctx context.Context, cfg KafkaConfig) (Subscriber, error) {
	return kafka.NewSubscriber(ctx, cfg)
}
