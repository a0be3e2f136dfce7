package consumer

import (
	"context"

	"github.com/pgrelay/pgrelay/internal/broker/kafka"
)

// KafkaConfig configures a Kafka subscriber: seed brokers, the topic prefix
// (an event of topic "orders" is in Kafka topic "<TopicPrefix>.orders"), the
// consumer group and its limits. Every field documents its default.
type KafkaConfig = kafka.Config

// SubscribeKafka returns a ConsumerConfig.Subscribe that joins the consumer
// group cfg.Group on the pgrelay topics:
//
//	cfg.Subscribe = pgrelay.SubscribeKafka(pgrelay.KafkaConfig{Brokers: []string{"kafka:9092"}, Group: "billing"})
//
// A partition's offset is committed only over the records the inbox stored
// (acknowledged), in order; a rebalance hands what was not stored to the new
// owner, and the inbox absorbs what comes twice.
func SubscribeKafka(cfg KafkaConfig) func(context.Context) (Subscriber, error) {
	return func(ctx context.Context) (Subscriber, error) {
		s, err := kafka.NewSubscriber(ctx, cfg)
		if err != nil {
			return nil, err
		}
		return s, nil
	}
}
