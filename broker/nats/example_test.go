package nats_test

import (
	"fmt"
	"time"

	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/nats"
)

// ExampleConfig shows one Config for both sides: the relay's publisher and a
// consumer's subscriber (a durable of its own per handler). Errors name the
// field at fault.
func ExampleConfig() {
	cfg := nats.Config{
		URL:          "nats://127.0.0.1:4222",
		CreateStream: true,                             // the publisher creates PGRELAY if missing
		Durable:      nats.DefaultDurable + "-billing", // the subscriber's durable consumer
		AckWait:      100 * time.Millisecond,           // below JetStream's floor of 1s
	}
	fmt.Println(cfg.ValidatePublisher())
	fmt.Println(cfg.ValidateSubscriber())

	// consumer.Config.Subscribe takes the subscriber this way:
	subscribe := broker.Subscribe(nats.NewSubscriber, cfg)
	_ = subscribe
	// Output:
	// <nil>
	// nats.Config.AckWait 100ms must be at least 1s
}
