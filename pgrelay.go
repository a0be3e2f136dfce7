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
	"context"
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
func (m Message) CausationID() string { return m.Headers[HeaderCausationID] }

// CorrelationID returns the id of the chain of events m belongs to: its
// HeaderCorrelationID header, or its own event id when it has none (m then
// starts a chain).
func (m Message) CorrelationID() string {
	if c := m.Headers[HeaderCorrelationID]; c != "" {
		return c
	}
	return m.EventID
}

func withCause(m Message, causation, correlation string) Message {
	if causation == "" {
		return m
	}
	_, hasCausation := m.Headers[HeaderCausationID]
	_, hasCorrelation := m.Headers[HeaderCorrelationID]
	if hasCausation && hasCorrelation {
		return m
	}
	h := make(map[string]string, len(m.Headers)+2)
	for k, v := range m.Headers {
		h[k] = v
	}
	if !hasCausation {
		h[HeaderCausationID] = causation
	}
	if !hasCorrelation {
		h[HeaderCorrelationID] = correlation
	}
	m.Headers = h
	return m
}

type causeKey struct{}

type cause struct{ causation, correlation string }

// contextWithCause returns a context that makes the outbox record cause as the
// origin of every message enqueued with it (see CausedBy). The inbox worker
// gives each handler such a context for the event it handles, so a handler
// that enqueues with its ctx links its output to its input without asking.
func contextWithCause(ctx context.Context, c Message) context.Context {
	if c.EventID == "" {
		return ctx
	}
	return context.WithValue(ctx, causeKey{}, cause{causation: c.EventID, correlation: c.CorrelationID()})
}

// causeFromContext applies the cause contextWithCause put in ctx, if any, to
// copies of msgs, as CausedBy does; without one it returns msgs as they are.
func causeFromContext(ctx context.Context, msgs []Message) []Message {
	c, ok := ctx.Value(causeKey{}).(cause)
	if !ok {
		return msgs
	}
	out := make([]Message, len(msgs))
	for i, m := range msgs {
		out[i] = withCause(m, c.causation, c.correlation)
	}
	return out
}

// storedHeaders returns the headers to store for m: its Headers, plus its
// ContentType under HeaderContentType when set. It returns m.Headers itself
// when there is no content type to add.
func (m Message) storedHeaders() map[string]string {
	if m.ContentType == "" {
		return m.Headers
	}
	h := make(map[string]string, len(m.Headers)+1)
	for k, v := range m.Headers {
		h[k] = v
	}
	h[HeaderContentType] = m.ContentType
	return h
}

// inboxHeaders returns the headers the inbox stores for m: storedHeaders',
// plus the trace context (event.HeaderTraceParent, event.HeaderTraceState) and the expiry
// (HeaderExpiresAt), which the outbox keeps in columns of its own and the
// inbox keeps with the headers (liftTrace and liftExpiresAt undo it). It
// returns m.Headers itself when there is nothing to add, one copy otherwise.
func (m Message) inboxHeaders() map[string]string {
	if m.ContentType == "" && m.TraceParent == "" && m.TraceState == "" && m.ExpiresAt.IsZero() {
		return m.Headers
	}
	h := make(map[string]string, len(m.Headers)+4)
	for k, v := range m.Headers {
		h[k] = v
	}
	if m.ContentType != "" {
		h[HeaderContentType] = m.ContentType
	}
	if m.TraceParent != "" {
		h[event.HeaderTraceParent] = m.TraceParent
	}
	if m.TraceState != "" {
		h[event.HeaderTraceState] = m.TraceState
	}
	if !m.ExpiresAt.IsZero() {
		h[HeaderExpiresAt] = m.ExpiresAt.UTC().Format(time.RFC3339Nano)
	}
	return h
}

// expired reports whether m has an expiry and now is at or past it.
func (m Message) expired(now time.Time) bool {
	return !m.ExpiresAt.IsZero() && !now.Before(m.ExpiresAt)
}

// liftExpiresAt moves an expiry stored under HeaderExpiresAt in m.Headers
// (the inbox's headers column) into m.ExpiresAt, unless ExpiresAt is set
// already. A value that is not RFC 3339 stays in the headers.
func (m *Message) liftExpiresAt() {
	v, ok := m.Headers[HeaderExpiresAt]
	if !ok {
		return
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return
	}
	if m.ExpiresAt.IsZero() {
		m.ExpiresAt = t
	}
	delete(m.Headers, HeaderExpiresAt)
}

// liftContentType moves a content type stored under HeaderContentType in
// m.Headers into m.ContentType (storedHeaders' inverse), unless ContentType
// is set already.
func (m *Message) liftContentType() {
	ct, ok := m.Headers[HeaderContentType]
	if !ok {
		return
	}
	if m.ContentType == "" {
		m.ContentType = ct
	}
	delete(m.Headers, HeaderContentType)
}

// liftTrace moves a trace context kept under event.HeaderTraceParent and
// event.HeaderTraceState in m.Headers into m.TraceParent and m.TraceState
// (inboxHeaders' inverse for them), unless they are set already.
func (m *Message) liftTrace() {
	if tp, ok := m.Headers[event.HeaderTraceParent]; ok {
		if m.TraceParent == "" {
			m.TraceParent = tp
		}
		delete(m.Headers, event.HeaderTraceParent)
	}
	if ts, ok := m.Headers[event.HeaderTraceState]; ok {
		if m.TraceState == "" {
			m.TraceState = ts
		}
		delete(m.Headers, event.HeaderTraceState)
	}
}
