// Package event defines the message that flows through pgrelay's outbox, the
// broker and the inbox, its validation, and how it maps onto broker headers.
// The public package at the module root re-exports these types.
package event

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// Message is one event: the unit the outbox publishes and the inbox receives.
type Message struct {
	// EventID identifies the event and is its idempotency key end to end
	// (outbox row, broker dedup id, inbox row). Required; at most 255 bytes of
	// valid UTF-8 (a UUID is the usual choice).
	EventID string
	// Topic names the stream of events (for example "orders"). The relay maps
	// it onto a broker subject.
	Topic string
	// Key is the ordering key: events with the same key are published in
	// commit order (for example the order id). At most MaxKeyLen bytes.
	Key string
	// KeySeq is the event's per-key sequence: 1, 2, 3, ... for the events of
	// one explicit Key, contiguous and in commit order, assigned by the
	// outbox when the event is stored (by the relay as it publishes, for an
	// event written with Emit and captured from the WAL) and carried as the
	// HeaderKeySeq broker header. Zero means none: an event without an
	// explicit key, or one that never went through pgrelay's outbox. The
	// outbox ignores a value set by the producer. An ordered inbox handler applies a key's events
	// strictly in this order.
	KeySeq int64
	// EventType names the event's schema (for example "OrderPaid").
	EventType string
	// Payload is the event body: any bytes (JSON, protobuf, Avro, ...).
	Payload []byte
	// ContentType is the payload's media type, for example
	// "application/json" or "application/x-protobuf". Optional. It travels as
	// the Pgrelay-Content-Type broker header and is stored with the headers
	// under that name. Only a text or JSON content type (see IsTextContentType)
	// makes the consumer require a UTF-8 payload; without one, any bytes pass.
	ContentType string
	// Headers are free-form string metadata carried alongside the payload.
	// Two names are pgrelay's: HeaderCausationID and HeaderCorrelationID
	// link the event to the one whose handling produced it (see CausedBy).
	Headers map[string]string
	// OccurredAt is when the event happened in the producer's domain.
	OccurredAt time.Time
	// NotBefore delays the event: the relay publishes it at or after this
	// time, compared with the database's clock, never before. Zero: at once.
	// A delayed event holds its key's later events (docs/delayed.md).
	NotBefore time.Time
	// Delay delays the event by this long from its insert, measured on the
	// database's clock (not the producer's). With NotBefore too, the later
	// of the two counts. Only the outbox reads it.
	Delay time.Duration
	// ExpiresAt is when the event expires: the relay does not publish it
	// after this time (the outbox row ends dead with the reason "expired"),
	// and the inbox does not apply it after this time (dead with the reason
	// "expired"). It travels as the HeaderExpiresAt broker header. Zero:
	// never.
	ExpiresAt time.Time
	// TraceParent and TraceState are the producer's W3C trace context
	// (https://www.w3.org/TR/trace-context/), captured at enqueue, stored in
	// the outbox's traceparent and tracestate columns and carried as the
	// broker headers of those names. Empty means none. See trace.go.
	TraceParent, TraceState string
}

// MaxEventIDLen is the longest accepted event id, in bytes.
const MaxEventIDLen = 255

// MaxKeyLen is the longest accepted ordering key, in bytes: the outbox
// refuses a longer one at Enqueue, and the consumer stores a delivery with a
// longer one dead. It is well under what a PostgreSQL btree entry can hold
// (about 2,700 bytes), so the key indexes (the outbox's and the inbox's
// per-key sequence index) never refuse a key that passed this check.
const MaxKeyLen = 1024

// ErrKeyTooLong is returned by ValidateKey for a key longer than MaxKeyLen.
var ErrKeyTooLong = errors.New("key too long")

// ValidateKey checks an ordering key's length (at most MaxKeyLen bytes).
func ValidateKey(key string) error {
	if len(key) > MaxKeyLen {
		return fmt.Errorf("%w: %d bytes, the limit is %d", ErrKeyTooLong, len(key), MaxKeyLen)
	}
	return nil
}

// Errors returned by ValidateEventID.
var (
	ErrMissingEventID = errors.New("event_id is required")
	ErrInvalidEventID = errors.New("event_id is invalid")
)

// ValidateEventID checks that id is usable as an idempotency key.
func ValidateEventID(id string) error {
	switch {
	case id == "":
		return ErrMissingEventID
	case len(id) > MaxEventIDLen:
		return fmt.Errorf("%w: longer than %d bytes", ErrInvalidEventID, MaxEventIDLen)
	case !utf8.ValidString(id):
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalidEventID)
	}
	for _, r := range id {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("%w: contains control characters", ErrInvalidEventID)
		}
	}
	return nil
}

// ErrOccurredAtOutOfRange is returned for an occurred_at outside the range
// pgrelay stores and carries: after 0001-01-01T00:00:00Z (Go's zero time,
// which means "unset") up to 9999-12-31T23:59:59.999999Z, once rounded to the
// microsecond, PostgreSQL's precision. Beyond year 9999 a time has no RFC 3339
// form, the format of the Pgrelay-Occurred-At header.
var ErrOccurredAtOutOfRange = errors.New("occurred_at is out of range: want after 0001-01-01T00:00:00Z and at most 9999-12-31T23:59:59.999999Z, at microsecond precision")

// occurredAtMin and occurredAtMax are the first and last valid occurred_at.
// The outbox migration 00045 enforces the same bounds in SQL.
var (
	occurredAtMin = time.Date(1, 1, 1, 0, 0, 0, 1000, time.UTC)
	occurredAtMax = time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC)
)

// NormalizeOccurredAt rounds t to the microsecond, as PostgreSQL stores it
// (half away from zero), and returns it in UTC, or ErrOccurredAtOutOfRange
// with the value when the rounded time is outside the valid range. Rounding
// first means the range holds for what is stored: 9999-12-31T23:59:59.9999995Z
// would be stored as year 10000 and is refused.
func NormalizeOccurredAt(t time.Time) (time.Time, error) {
	r := t.Round(time.Microsecond).UTC()
	if r.Before(occurredAtMin) || r.After(occurredAtMax) {
		return r, fmt.Errorf("%w: got %s", ErrOccurredAtOutOfRange, t.UTC().Format(time.RFC3339Nano))
	}
	return r, nil
}

// pgrelay's logical header names. The relay writes them on every published
// message and the consumer reads them back; the payload travels as the
// message body. Each broker adapter (package broker and its sub-packages)
// maps them onto its broker and owns its broker's own names (Nats-Msg-Id, an
// AMQP message-id, a Kafka record key).
const (
	HeaderEventID   = "Pgrelay-Event-Id"
	HeaderEventType = "Pgrelay-Event-Type"
	HeaderTopic     = "Pgrelay-Topic"
	HeaderKey       = "Pgrelay-Key"
	// HeaderKeySeq carries Message.KeySeq in decimal; absent when zero.
	HeaderKeySeq     = "Pgrelay-Key-Seq"
	HeaderOccurredAt = "Pgrelay-Occurred-At" // RFC 3339 with nanoseconds
	// HeaderExpiresAt carries Message.ExpiresAt (RFC 3339 with nanoseconds);
	// absent when the event never expires. The inbox keeps it in its headers
	// column under this name.
	HeaderExpiresAt = "Pgrelay-Expires-At"
	// HeaderCausationID is the event id of the event whose handling produced
	// this one. It is kept in Message.Headers under this very name, stored
	// in the outbox's headers column, and published as a broker header of
	// its own (not under HeaderPrefix).
	HeaderCausationID = "Pgrelay-Causation-Id"
	// HeaderCorrelationID names the chain of events this one belongs to: the
	// correlation id of its cause, or the cause's event id when the cause
	// had none. Kept and published like HeaderCausationID.
	HeaderCorrelationID = "Pgrelay-Correlation-Id"

	// HeaderContentType carries Message.ContentType, on the broker and, under
	// the same name, in the outbox's and inbox's headers column (so that a
	// plain-SQL producer sets it there).
	HeaderContentType = "Pgrelay-Content-Type"
	// HeaderPrefix prefixes the message's own Headers on the broker.
	HeaderPrefix = "Pgrelay-H-"
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

// CausedBy returns copies of msgs recording cause as the event they follow
// from: HeaderCausationID is cause's event id and HeaderCorrelationID is
// cause's correlation id (see CorrelationID). A message that already has
// either header keeps it. msgs are not modified.
func CausedBy(cause Message, msgs ...Message) []Message {
	out := make([]Message, len(msgs))
	for i, m := range msgs {
		out[i] = withCause(m, cause.EventID, cause.CorrelationID())
	}
	return out
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

// WithCause returns a context that makes the outbox record cause as the
// origin of every message enqueued with it (see CausedBy). The inbox worker
// gives each handler such a context for the event it handles, so a handler
// that enqueues with its ctx links its output to its input without asking.
func WithCause(ctx context.Context, c Message) context.Context {
	if c.EventID == "" {
		return ctx
	}
	return context.WithValue(ctx, causeKey{}, cause{causation: c.EventID, correlation: c.CorrelationID()})
}

// WithCauseFromContext applies the cause WithCause put in ctx, if any, to
// copies of msgs, as CausedBy does; without one it returns msgs as they are.
func WithCauseFromContext(ctx context.Context, msgs []Message) []Message {
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

// StoredHeaders returns the headers to store for m: its Headers, plus its
// ContentType under HeaderContentType when set. It returns m.Headers itself
// when there is no content type to add.
func (m Message) StoredHeaders() map[string]string {
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

// InboxHeaders returns the headers the inbox stores for m: StoredHeaders',
// plus the trace context (HeaderTraceParent, HeaderTraceState) and the expiry
// (HeaderExpiresAt), which the outbox keeps in columns of its own and the
// inbox keeps with the headers (LiftTrace and LiftExpiresAt undo it). It
// returns m.Headers itself when there is nothing to add, one copy otherwise.
func (m Message) InboxHeaders() map[string]string {
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
		h[HeaderTraceParent] = m.TraceParent
	}
	if m.TraceState != "" {
		h[HeaderTraceState] = m.TraceState
	}
	if !m.ExpiresAt.IsZero() {
		h[HeaderExpiresAt] = m.ExpiresAt.UTC().Format(time.RFC3339Nano)
	}
	return h
}

// Expired reports whether m has an expiry and now is at or past it.
func (m Message) Expired(now time.Time) bool {
	return !m.ExpiresAt.IsZero() && !now.Before(m.ExpiresAt)
}

// ReasonExpired starts the reason recorded on an event not published or not
// applied because it expired.
const ReasonExpired = "expired"

// LiftExpiresAt moves an expiry stored under HeaderExpiresAt in m.Headers
// (the inbox's headers column) into m.ExpiresAt, unless ExpiresAt is set
// already. A value that is not RFC 3339 stays in the headers.
func (m *Message) LiftExpiresAt() {
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

// LiftContentType moves a content type stored under HeaderContentType in
// m.Headers into m.ContentType (StoredHeaders' inverse), unless ContentType
// is set already.
func (m *Message) LiftContentType() {
	ct, ok := m.Headers[HeaderContentType]
	if !ok {
		return
	}
	if m.ContentType == "" {
		m.ContentType = ct
	}
	delete(m.Headers, HeaderContentType)
}

// IsTextContentType reports whether the media type ct says the payload is
// text: text/*, application/json, any +json or +xml suffix, application/xml
// and application/x-www-form-urlencoded. Parameters (";charset=...") are
// ignored. Such payloads must be UTF-8; all others are opaque bytes.
func IsTextContentType(ct string) bool {
	mt, _, _ := strings.Cut(ct, ";")
	mt = strings.ToLower(strings.TrimSpace(mt))
	switch {
	case mt == "":
		return false
	case strings.HasPrefix(mt, "text/"),
		mt == "application/json", strings.HasSuffix(mt, "+json"),
		mt == "application/xml", strings.HasSuffix(mt, "+xml"),
		mt == "application/x-www-form-urlencoded":
		return true
	}
	return false
}
