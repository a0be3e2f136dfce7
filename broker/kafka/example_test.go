package kafka_test

import (
	"fmt"

	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/kafka"
)

// ExampleConfig configures the Kafka adapter for both sides: an event of
// topic "orders" goes to the Kafka topic "shop.orders"; the subscriber joins
// the consumer group "billing". Errors name the field at fault.
func ExampleConfig() {
	cfg := kafka.Config{Brokers: []string{"kafka:9092"}, TopicPrefix: "shop", Group: "billing"}.WithDefaults()
	fmt.Println(cfg.KafkaTopic("orders"), cfg.Validate())

	cfg.Brokers = []string{"kafka"}
	fmt.Println(cfg.Validate())

	// consumer.Config.Subscribe takes the subscriber this way:
	subscribe := broker.Subscribe(kafka.NewSubscriber, cfg)
	_ = subscribe
	// Output:
	// shop.orders <nil>
	// kafka.Config.Brokers: "kafka" is not host:port
}
