package rabbitmq_test

import (
	"fmt"

	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/rabbitmq"
)

// ExampleConfig configures the RabbitMQ adapter for both sides: the relay
// publishes to the exchange "pgrelay", the consumer reads the queue
// "billing" bound to it, storing payloads over 1 MiB dead. Errors name the
// field at fault.
func ExampleConfig() {
	cfg := rabbitmq.Config{URL: "amqp://guest:guest@127.0.0.1:5672/", Queue: "billing", MaxPayloadBytes: 1 << 20}
	fmt.Println(cfg.WithDefaults().Validate())

	cfg.URL = "http://127.0.0.1:5672/"
	fmt.Println(cfg.WithDefaults().Validate())

	// consumer.Config.Subscribe takes the subscriber this way:
	subscribe := broker.Subscribe(rabbitmq.NewSubscriber, cfg)
	_ = subscribe
	// Output:
	// <nil>
	// rabbitmq.Config.URL "http://127.0.0.1:5672/" is not an amqp:// or amqps:// URL
}
