// Package event defines the message that flows through pgrelay's outbox, the
// broker and the inbox, its validation, and how it maps onto broker headers.
// The public package at the module root re-exports these types.
package event

import (
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
	// commit order (for example the order id).
	Key string
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
	Headers map[string]string
	// OccurredAt is when the event happened in the producer's domain.
	OccurredAt time.Time
}

// MaxEventIDLen is the longest accepted event id, in bytes.
const MaxEventIDLen = 255

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

// Broker header names. The relay writes them on every published message and
// the consumer reads them back; the payload travels as the message body.
const (
	// HeaderMsgID is JetStream's dedup header; pgrelay sets it to the event id.
	HeaderMsgID      = "Nats-Msg-Id"
	HeaderEventID    = "Pgrelay-Event-Id"
	HeaderEventType  = "Pgrelay-Event-Type"
	HeaderTopic      = "Pgrelay-Topic"
	HeaderKey        = "Pgrelay-Key"
	HeaderOccurredAt = "Pgrelay-Occurred-At" // RFC 3339 with nanoseconds
	// HeaderContentType carries Message.ContentType, on the broker and, under
	// the same name, in the outbox's and inbox's headers column (so that a
	// plain-SQL producer sets it there).
	HeaderContentType = "Pgrelay-Content-Type"
	// HeaderPrefix prefixes the message's own Headers on the broker.
	HeaderPrefix = "Pgrelay-H-"
)

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
