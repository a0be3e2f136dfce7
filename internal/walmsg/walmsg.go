// Package walmsg is the encoding of an event written to the write-ahead log
// with pg_logical_emit_message (pgrelay.Emit, the SQL function pgrelay.emit)
// and read back by the relay's WAL capture. The content is a JSON object, so
// that plain SQL can build it (jsonb_build_object) as well as Go:
//
//	{"v":1,"id":"…","topic":"…","key":"…","type":"…","ct":"…",
//	 "headers":{"…":"…"},"at":"2026-01-02T03:04:05.123456Z","payload":"<base64>",
//	 "exp":"2026-01-02T04:00:00Z","traceparent":"00-…-…-01","tracestate":"…"}
//
// v is the format's version: a reader refuses a version it does not know
// rather than guess. key, type, ct, headers, exp (the expiry), traceparent
// and tracestate (the W3C trace context, docs/tracing.md; an unusable one is
// ignored) may be absent; payload is the
// payload's bytes in standard base64 (line breaks, as PostgreSQL's encode
// writes them, are ignored).
package walmsg

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/pgrelay/pgrelay/internal/event"
)

// Event is an event as the WAL carries it: the fields of pgrelay.Message
// that an emitted event has (no sequence, no delay). The relay turns it into
// the message it publishes.
type Event struct {
	EventID, Topic, Key, EventType, ContentType string
	Headers                                     map[string]string
	OccurredAt                                  time.Time
	Payload                                     []byte
	ExpiresAt                                   time.Time // zero: none
	TraceParent, TraceState                     string
}

// Prefix is the logical decoding message prefix of pgrelay's events.
const Prefix = "pgrelay"

// HeartbeatPrefix is the prefix of the relay's non-transactional heartbeat
// messages, which advance a quiet database's WAL so that the slot's confirmed
// position can move on.
const HeartbeatPrefix = "pgrelay-heartbeat"

// Version is the format version Encode writes.
const Version = 1

type wire struct {
	V       int               `json:"v"`
	ID      string            `json:"id"`
	Topic   string            `json:"topic"`
	Key     string            `json:"key,omitempty"`
	Type    string            `json:"type,omitempty"`
	CT      string            `json:"ct,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
	At      time.Time         `json:"at"`
	Payload []byte            `json:"payload"`
	// Exp is the event's expiry (Message.ExpiresAt); absent for none. A
	// reader that predates it ignores it.
	Exp *time.Time `json:"exp,omitempty"`
	// The producer's W3C trace context (Message.TraceParent, TraceState);
	// absent when none.
	TraceParent string `json:"traceparent,omitempty"`
	TraceState  string `json:"tracestate,omitempty"`
}

// Encode returns m's content for pg_logical_emit_message. m must be
// validated and complete (event id, key, occurred at set).
func Encode(m Event) ([]byte, error) {
	w := wire{
		V: Version, ID: m.EventID, Topic: m.Topic, Key: m.Key, Type: m.EventType, CT: m.ContentType,
		Headers: m.Headers, At: m.OccurredAt.UTC(), Payload: m.Payload,
		TraceParent: m.TraceParent, TraceState: m.TraceState,
	}
	if !m.ExpiresAt.IsZero() {
		exp := m.ExpiresAt.UTC()
		w.Exp = &exp
	}
	return json.Marshal(w)
}

// ErrVersion is returned by Decode for a format version it does not know.
var ErrVersion = errors.New("walmsg: unknown format version")

// Decode parses a message written by Encode or pgrelay.emit. A message
// without an event id or a topic is refused.
func Decode(b []byte) (Event, error) {
	var w wire
	if err := json.Unmarshal(b, &w); err != nil {
		return Event{}, fmt.Errorf("walmsg: %w", err)
	}
	if w.V != Version {
		return Event{}, fmt.Errorf("%w: %d", ErrVersion, w.V)
	}
	if err := event.ValidateEventID(w.ID); err != nil {
		return Event{}, fmt.Errorf("walmsg: %w", err)
	}
	if w.Topic == "" {
		return Event{}, errors.New("walmsg: topic is missing")
	}
	m := Event{
		EventID: w.ID, Topic: w.Topic, Key: w.Key, EventType: w.Type, ContentType: w.CT,
		Headers: w.Headers, OccurredAt: w.At.UTC(), Payload: w.Payload,
		TraceParent: w.TraceParent, TraceState: w.TraceState,
	}
	if w.Exp != nil {
		m.ExpiresAt = w.Exp.UTC()
	}
	return complete(m), nil
}

// Row is an event inserted into pgrelay.outbox_wal, as the relay decodes
// it from the insert's new tuple: the columns of the outbox's plain-SQL
// contract (docs/wal.md). Headers is the jsonb column's text.
type Row struct {
	EventID, Topic, Key, EventType string
	Payload                        []byte
	Headers                        []byte
	OccurredAt                     time.Time
	ExpiresAt                      time.Time // zero: none
	TraceParent, TraceState        string
}

// FromRow returns the event r carries, completed as Decode completes an
// emitted one (key the event id when empty, the content type and the trace
// context lifted from the headers), so that both reach the publisher alike.
// An event without an event id or a topic, or with headers that are not a
// JSON object of strings, is refused.
func FromRow(r Row) (Event, error) {
	if err := event.ValidateEventID(r.EventID); err != nil {
		return Event{}, fmt.Errorf("walmsg: %w", err)
	}
	if r.Topic == "" {
		return Event{}, errors.New("walmsg: topic is missing")
	}
	m := Event{
		EventID: r.EventID, Topic: r.Topic, Key: r.Key, EventType: r.EventType, Payload: r.Payload,
		OccurredAt: r.OccurredAt.UTC(), TraceParent: r.TraceParent, TraceState: r.TraceState,
	}
	if !r.ExpiresAt.IsZero() {
		m.ExpiresAt = r.ExpiresAt.UTC()
	}
	if len(r.Headers) > 0 && string(r.Headers) != "{}" {
		if err := json.Unmarshal(r.Headers, &m.Headers); err != nil {
			return Event{}, fmt.Errorf("walmsg: headers must be a JSON object of strings: %w", err)
		}
	}
	return complete(m), nil
}

// complete fills in what a producer may leave out, as the outbox does.
func complete(m Event) Event {
	if m.Key == "" {
		m.Key = m.EventID
	}
	if m.Payload == nil {
		m.Payload = []byte{}
	}
	// A producer writing plain SQL may put the content type among the
	// headers, as the outbox stores it.
	if ct, ok := m.Headers[event.HeaderContentType]; ok {
		if m.ContentType == "" {
			m.ContentType = ct
		}
		delete(m.Headers, event.HeaderContentType)
	}
	// The trace context: its own fields, or (pgrelay.emit, which has no
	// parameter for it) the traceparent and tracestate headers.
	for name, field := range map[string]*string{event.HeaderTraceParent: &m.TraceParent, event.HeaderTraceState: &m.TraceState} {
		if v, ok := m.Headers[name]; ok {
			if *field == "" {
				*field = v
			}
			delete(m.Headers, name)
		}
	}
	if m.TraceParent == "" || event.ValidTraceContext(m.TraceParent, m.TraceState) != "" {
		m.TraceParent, m.TraceState = "", ""
	}
	return m
}

// A message with the Prefix is published only when it carries the proof
// that an allowed role wrote it (docs/wal.md#who-can-publish): its content
// is a signature line, then the event,
//
//	hmac-sha256:<key id>:<64 hex digits>\n<the event's JSON>
//
// the HMAC-SHA256 (RFC 2104) of the event's bytes under the key
// pgrelay.wal_keys holds with that id. Only the SECURITY DEFINER functions
// pgrelay.emit and pgrelay.emit_wal, executable by the roles the operator
// granted, read a key and sign; pg_logical_emit_message, which any role may
// call, writes nothing the relay publishes.
const sigScheme = "hmac-sha256:"

// Why Verify refuses a message (the reason label of
// relay_wal_rejected_total).
var (
	// ErrUnsigned: no signature line; written with pg_logical_emit_message
	// directly, not by pgrelay.emit or pgrelay.Emit of this release.
	ErrUnsigned = errors.New("unsigned")
	// ErrUnknownKey: signed with a key id pgrelay.wal_keys does not hold
	// (deleted, or made up).
	ErrUnknownKey = errors.New("unknown_key")
	// ErrBadSignature: the signature does not match the content (forged or
	// altered).
	ErrBadSignature = errors.New("bad_signature")
)

// Sign returns body's content signed with key (id kid), as pgrelay.emit_wal
// writes it.
func Sign(body []byte, kid int32, key []byte) []byte {
	mac := hmac.New(sha256.New, key)
	mac.Write(body)
	out := fmt.Appendf(nil, "%s%d:%x\n", sigScheme, kid, mac.Sum(nil))
	return append(out, body...)
}

// Verify checks content's signature against keys (by id) and returns the
// event's bytes, or ErrUnsigned, ErrUnknownKey or ErrBadSignature (with the
// key id when one was read).
func Verify(content []byte, keys map[int32][]byte) ([]byte, int32, error) {
	line, body, ok := bytes.Cut(content, []byte{'\n'})
	rest, signed := bytes.CutPrefix(line, []byte(sigScheme))
	if !ok || !signed {
		return nil, 0, ErrUnsigned
	}
	id, sig, ok := bytes.Cut(rest, []byte{':'})
	kid, err := strconv.ParseInt(string(id), 10, 32)
	want := make([]byte, sha256.Size)
	if !ok || err != nil || len(sig) != 2*sha256.Size {
		return nil, 0, ErrBadSignature
	}
	if _, err := hex.Decode(want, sig); err != nil {
		return nil, int32(kid), ErrBadSignature
	}
	key, found := keys[int32(kid)]
	if !found {
		return nil, int32(kid), ErrUnknownKey
	}
	mac := hmac.New(sha256.New, key)
	mac.Write(body)
	if !hmac.Equal(mac.Sum(nil), want) {
		return nil, int32(kid), ErrBadSignature
	}
	return body, int32(kid), nil
}
