// Package event holds what the message (pgrelay.Message) is checked and
// carried with, below every package that uses it: the validation of its
// fields and the names of its broker headers.
package event

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

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

// ReasonExpired starts the reason recorded on an event not published or not
// applied because it expired.
const ReasonExpired = "expired"

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

// ValidTopic reports whether topic follows the rule Enqueue applies and the
// outbox table's outbox_topic_valid constraint holds plain SQL to: 1 to 255
// bytes of letters, digits, '-' and '_' in non-empty parts separated by '.'.
func ValidTopic(topic string) bool { return ValidToken(topic, true) }

// ValidToken reports whether s is usable as a broker subject part (dots
// allowed when dots is set, then with no empty part) or header name.
func ValidToken(s string, dots bool) bool {
	if s == "" || len(s) > 255 {
		return false
	}
	prevDot := true
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
			prevDot = false
		case r == '.' && dots:
			if prevDot {
				return false
			}
			prevDot = true
		default:
			return false
		}
	}
	return !prevDot || !dots
}
