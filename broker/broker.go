// Package broker is the seam between pgrelay and a message broker: the
// Publisher interface the relay publishes through, the Subscriber interface
// the consumer fetches from, the Delivery a subscriber returns, the
// classification of publish failures (Terminal), the broker-neutral decoding
// of received messages (Decode, EncodeHeaders), the header names, and the
// CloudEvents binary-mode bindings an adapter publishes with under
// WireCloudEvents (CloudEventsHeaders).
//
// The adapters live in sub-packages, each with the same shape
// (NewPublisher(ctx, Config), NewSubscriber(ctx, Config), a Config holding its
// own limits): broker/nats (NATS JetStream), broker/kafka and
// broker/rabbitmq; a program imports only the one it uses. broker/postgres
// has a Publisher only: it stores into a target database's inbox, and that
// database's consumer runs without a subscriber. broker/brokertest
// is the conformance suite every adapter passes; a third-party adapter proves
// itself with it.
package broker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgrelay/pgrelay"
)

// Publisher publishes batches of events to a broker.
type Publisher interface {
	// Publish sends every message and waits until each one is acknowledged
	// (persisted by the broker) or has failed, or ctx is done. It returns one
	// Result per message, in order. Messages of one key are sent in slice
	// order, and none of a key's later messages is stored once an earlier one
	// failed transiently.
	Publish(ctx context.Context, msgs []pgrelay.Message) []Result
	// Close releases the publisher's connections.
	Close() error
}

// Subscriber fetches deliveries for one named consumer (JetStream durable,
// Kafka consumer group, RabbitMQ queue). Deliveries not acknowledged are
// redelivered by the broker (after its ack wait, a rebalance, a
// channel/connection close).
type Subscriber interface {
	// Fetch waits at most maxWait for a first delivery and returns up to max
	// of them, in broker order. It returns (nil, nil) when nothing arrived in
	// time. An error is a transient broker failure: the caller backs off and
	// fetches again (the adapter reconnects by itself). Deliveries returned
	// with an error are valid and are stored like any other. An error for
	// which IsTerminal is true is a setting no retry can fix (a NATS stream
	// outliving the dedup window): the consumer stops with it.
	// Fetch never returns a delivery it cannot identify stably: one without a
	// usable event id gets a stand-in id derived from its broker position
	// (stream+seq, topic+partition+offset, ...), the same on every
	// redelivery, or is left unacknowledged and logged.
	Fetch(ctx context.Context, max int, maxWait time.Duration) ([]Delivery, error)
	// Close stops fetching and releases connections. Unacknowledged
	// deliveries are redelivered later.
	Close() error
}

// Retention is what a broker keeps of the messages a subscriber reads, as
// the adapter reads it from the broker.
type Retention struct {
	// Kind names what is described ("NATS JetStream stream").
	Kind string
	// Name is the stream's (topic's, queue's) name.
	Name string
	// MaxAge is how long the broker keeps a message; 0 means without limit.
	MaxAge time.Duration
	// DuplicateWindow is the broker's own duplicate window (0: none).
	DuplicateWindow time.Duration
}

// RetentionReporter is implemented by the subscribers that can read their
// broker's retention (broker/nats): the web console shows it against the
// inbox's dedup window. Optional for an adapter.
type RetentionReporter interface {
	Retention(ctx context.Context) (Retention, error)
}

// Subscribe returns a function creating a subscriber with newSubscriber and
// cfg, the shape consumer.Config.Subscribe takes:
//
//	Subscribe: broker.Subscribe(nats.NewSubscriber, nats.Config{URL: "nats://127.0.0.1:4222"})
func Subscribe[C any, S Subscriber](newSubscriber func(context.Context, C) (S, error), cfg C) func(context.Context) (Subscriber, error) {
	return func(ctx context.Context) (Subscriber, error) {
		s, err := newSubscriber(ctx, cfg)
		if err != nil {
			return nil, err
		}
		return s, nil
	}
}

// Delivery is one received message, decoded.
type Delivery struct {
	// Message is the event, always storable: text fields valid UTF-8 without
	// NUL, event id valid (event.ValidateEventID), even when DeadReason is
	// set.
	Message pgrelay.Message
	// DeadReason is empty for a usable message; otherwise the inbox stores it
	// dead with this reason.
	DeadReason string
	// Ref names the delivery's broker position for logs ("stream PGRELAY seq
	// 42", "orders/3@17").
	Ref string
	// Ack tells the broker the delivery is stored; called only after the
	// inbox transaction commits. Kafka: commits the partition's offset once
	// every earlier delivery of that partition is acked.
	Ack func(ctx context.Context) error
	// InProgress postpones redelivery while storing is retried; a no-op where
	// the broker has no such notion (return nil).
	InProgress func(ctx context.Context) error
	// FirstDelivery is set only when the broker says it never delivered
	// this message before (NATS: NumDelivered 1; RabbitMQ: not redelivered).
	// False when it was redelivered or the broker cannot tell (Kafka): the
	// consumer then never applies it on receive, so that a message whose
	// handler kills the process is next run by a claim, which counts the
	// attempt.
	FirstDelivery bool
}

// Result is the outcome of publishing one message.
type Result struct {
	// Err is nil once the broker acknowledged the message. Otherwise it is
	// the failure; IsTerminal tells whether retrying can help.
	Err error
	// Duplicate is set when the broker acknowledged the message as a
	// duplicate of one it already holds (same event id).
	Duplicate bool
}

// TerminalError marks a failure that no retry can fix (the message is too
// large, no stream accepts its subject): the relay dead-letters the event.
type TerminalError struct {
	Err error
}

// Error returns the reason.
func (e *TerminalError) Error() string { return "permanent: " + e.Err.Error() }

// Unwrap returns the underlying error.
func (e *TerminalError) Unwrap() error { return e.Err }

// Terminal wraps err as a TerminalError.
func Terminal(err error) error {
	if err == nil {
		return nil
	}
	return &TerminalError{Err: err}
}

// Terminalf formats a TerminalError.
func Terminalf(format string, args ...any) error {
	return &TerminalError{Err: fmt.Errorf(format, args...)}
}

// IsTerminal reports whether err is a TerminalError.
func IsTerminal(err error) bool {
	var p *TerminalError
	return errors.As(err, &p)
}
