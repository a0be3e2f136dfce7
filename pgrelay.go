// Package pgrelay is a PostgreSQL-native transactional outbox and inbox.
//
// Applications write events into the outbox inside their own pgx transaction
// (Enqueue); the relay publishes committed rows to the broker. Consumers store
// every received message in the inbox, deduplicated by event id (Receive), and
// run handlers (an InboxWorker) whose side effects commit in the same
// transaction as the inbox row's processed mark, so each event's effect
// happens exactly once.
//
// This package is the core every program needs and costs only what it does:
// it depends on pgx and the standard library, never on a broker client, a
// CLI or a metrics library. The rest is opt-in, each in a package of its own:
//
//   - github.com/pgrelay/pgrelay/consumer: a service consuming from a broker
//     into the inbox and running a handler, with metrics, health and the
//     admin API;
//   - github.com/pgrelay/pgrelay/relay: the relay as a library, publishing
//     the outbox to a broker;
//   - github.com/pgrelay/pgrelay/broker: the broker seam (Publisher,
//     Subscriber, Delivery, the header names), with the adapters in
//     broker/nats, broker/kafka and broker/rabbitmq and their conformance
//     suite in broker/brokertest.
//
// Logging: the configurations of this module take a *slog.Logger.
package pgrelay

import (
	"time"

	"github.com/pgrelay/pgrelay/internal/event"
)

// Message is one event: what Enqueue writes to the outbox, what the relay
// publishes, and what the inbox receives.
type Message struct {
	// EventID identifies the event and is its idempotency key end to end
	// (outbox row, broker dedup id, inbox row). At most 255 bytes of valid
	// UTF-8 (a UUID is the usual choice). Enqueue sets an empty one to a new
	// UUIDv7; Receive requires it.
	EventID string
	// Topic names the stream of events (for example "orders"). The relay maps
	// it onto a broker subject, topic or routing key. Required.
	Topic string
	// Key is the ordering key: events with the same key are published in
	// commit order (for example the order id). Enqueue sets an empty one to
	// the EventID (the event is then ordered with no other).
	Key string
	// KeySeq is the event's per-key sequence: 1, 2, 3, ... for the events of
	// one explicit Key, contiguous and in commit order, assigned by the
	// outbox when the event is stored (by the relay as it publishes, for an
	// event written with Emit and captured from the WAL) and carried as the
	// HeaderKeySeq broker header. Zero means none: an event without an
	// explicit key, or one that never went through pgrelay's outbox. The
	// outbox ignores a value set by the producer. An ordered inbox handler (InboxConfig.Ordered)
	// applies a key's events strictly in this order.
	KeySeq int64
	// EventType names the event's schema (for example "OrderPaid").
	EventType string
	// Payload is the event body: any bytes (JSON, protobuf, Avro, ...), at
	// most OutboxConfig.MaxPayloadBytes (DefaultMaxPayloadBytes, 1 MiB).
	Payload []byte
	// ContentType is the payload's media type, for example
	// "application/json" or "application/x-protobuf". Optional. It travels as
	// the HeaderContentType broker header and is stored with the headers
	// under that name. Only a text or JSON content type (IsTextContentType)
	// requires a UTF-8 payload; without one, any bytes pass.
	ContentType string
	// Headers are free-form string metadata carried alongside the payload.
	// Two names are pgrelay's: HeaderCausationID and HeaderCorrelationID
	// link the event to the one whose handling produced it (see CausedBy).
	Headers map[string]string
	// OccurredAt is when the event happened in the producer's domain.
	// Enqueue sets a zero one to now and rounds it to the microsecond, as
	// PostgreSQL stores it (ErrOccurredAtOutOfRange otherwise).
	OccurredAt time.Time
	// NotBefore delays the event: the relay publishes it at or after this
	// time, compared with the database's clock, never before. Zero: at
	// once. A delayed event holds the later events of its Key until it is
	// published, so per-key order stays true; events of other keys are not
	// held. See docs/delayed.md.
	NotBefore time.Time
	// Delay delays the event by this long from its insert, measured on the
	// database's clock rather than the producer's. With NotBefore too, the
	// later of the two counts. Only Enqueue reads it.
	Delay time.Duration
	// ExpiresAt is when the event expires. The relay does not publish it
	// after this time (the outbox row ends dead with the reason "expired"),
	// and an inbox worker does not apply it after this time (dead with the
	// reason "expired"). It travels as the Pgrelay-Expires-At broker
	// header. Zero: never.
	ExpiresAt time.Time
	// TraceParent and TraceState are the producer's W3C trace context
	// (the traceparent and tracestate of https://www.w3.org/TR/trace-context/),
	// captured when the event is enqueued. Optional: empty means none. The
	// outbox stores them in its traceparent and tracestate columns, the
	// relay publishes them as broker headers of those names, and the inbox
	// hands them to the handler, so that one trace runs from the producer to
	// the handler. This package does not depend on OpenTelemetry: the
	// package otelpgrelay fills them from a span (otelpgrelay.Enqueue), and
	// a producer using another tracing library sets them itself. At most
	// MaxTraceParentLen and MaxTraceStateLen bytes of text without line
	// breaks. See docs/tracing.md.
	TraceParent, TraceState string
}

// The longest TraceParent and TraceState Enqueue accepts, in bytes (the
// outbox table's outbox_trace_context_length constraint).
const (
	MaxTraceParentLen = event.MaxTraceParentLen
	MaxTraceStateLen  = event.MaxTraceStateLen
)

// CausationID returns the event id of the event whose handling produced m
// (its HeaderCausationID header), or "" when m has no recorded cause.
func (m Message) CausationID() string { return event.Message(m).CausationID() }

// CorrelationID returns the id of the chain of events m belongs to: its
// HeaderCorrelationID header, or its own event id when it has none (m then
// starts a chain).
func (m Message) CorrelationID() string { return event.Message(m).CorrelationID() }

// toEvents converts messages to the engine's type (the same fields).
func toEvents(msgs []Message) []event.Message {
	out := make([]event.Message, len(msgs))
	for i, m := range msgs {
		out[i] = event.Message(m)
	}
	return out
}

func fromEvents(msgs []event.Message) []Message {
	out := make([]Message, len(msgs))
	for i, m := range msgs {
		out[i] = Message(m)
	}
	return out
}

func toEvent(m Message) event.Message { return event.Message(m) }
