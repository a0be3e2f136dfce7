package consumer

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/pgrelay/pgrelay/internal/event"
)

// Delivery is one message as fetched from JetStream, reduced to what Decode
// reads. Keeping it a plain struct makes Decode a pure function.
type Delivery struct {
	// Subject is the subject the message was published to.
	Subject string
	// Header holds the message headers (case-sensitive, as in NATS).
	Header map[string][]string
	// Data is the message body: the event payload.
	Data []byte
	// Stream is the JetStream stream that stored the message.
	Stream string
	// StreamSeq is the message's sequence number in Stream. Together with
	// Stream and StreamCreated it identifies the message when it carries no
	// usable event id.
	StreamSeq uint64
	// StreamCreated is when Stream was created. Sequence numbers start again
	// at 1 in a re-created stream; the creation time tells the two apart.
	StreamCreated time.Time
	// Timestamp is when the stream stored the message; it stands in for a
	// missing occurred-at header.
	Timestamp time.Time
}

// DecodeOptions are the limits Decode applies.
type DecodeOptions struct {
	// SubjectPrefix is stripped from the subject to find the topic when the
	// message has no Pgrelay-Topic header, for example "pgrelay".
	SubjectPrefix string
	// MaxPayloadBytes is the largest accepted payload; a larger one is stored
	// dead. Zero means no limit.
	MaxPayloadBytes int
}

// Decoded is what Decode makes of a delivery: the message to store in the
// inbox and, when the delivery is unusable, why. A decoded message is always
// storable: its text fields are valid UTF-8 without NUL bytes and its event id
// passes event.ValidateEventID, even when DeadReason is set.
type Decoded struct {
	// Message is the event to store. Payload holds the raw bytes received.
	Message event.Message
	// DeadReason is empty for a usable message; otherwise the message is
	// stored directly as dead with this reason.
	DeadReason string
}

// Reasons a delivery is stored dead at ingest. They start the DeadReason text,
// followed by details.
const (
	ReasonMissingEventID    = "missing event id"
	ReasonInvalidEventID    = "invalid event id"
	ReasonMissingEventType  = "missing event type"
	ReasonInvalidHeader     = "invalid header"
	ReasonInvalidOccurredAt = "invalid occurred-at"
	ReasonPayloadTooLarge   = "payload too large"
	ReasonPayloadNotUTF8    = "payload is not valid UTF-8"
	ReasonNoStreamSequence  = "no stream sequence"
)

// RawEventIDHeader is the inbox header that keeps an unusable event id as
// received (made printable), next to the stand-in id the row is stored under.
const RawEventIDHeader = "Pgrelay-Raw-Event-Id"

// FallbackEventID is the stable id given to a delivery without a usable event
// id: "nats:<stream>:<stream creation time, Unix nanoseconds>:<stream seq>". A
// redelivery of the same stream message gets the same id, so the inbox still
// deduplicates it; a message of a re-created stream (whose sequence numbers
// start again at 1) gets another, so it is never taken for a duplicate of an
// old one. Without a creation time the id is "nats:<stream>:<stream seq>".
func FallbackEventID(stream string, created time.Time, seq uint64) string {
	if created.IsZero() {
		return "nats:" + stream + ":" + strconv.FormatUint(seq, 10)
	}
	return "nats:" + stream + ":" + strconv.FormatInt(created.UnixNano(), 10) + ":" + strconv.FormatUint(seq, 10)
}

// Decode turns a delivery into the message to store. It never fails: a
// delivery it cannot use comes back with DeadReason set, its raw payload kept,
// so that the consumer stores it dead, acknowledges it and moves on.
//
// Decode checks what the transport carries: the event id (Pgrelay-Event-Id,
// else Nats-Msg-Id), the event type header, the occurred-at header, header
// text, the payload size and, when the content type (Pgrelay-Content-Type)
// says text or JSON, that the payload is UTF-8; any other payload is opaque
// bytes (protobuf, Avro), stored as received. It does not look inside the
// payload: the handler owns the payload's schema and reports a bad
// shape or an unknown event type as a permanent failure.
func Decode(d Delivery, opts DecodeOptions) Decoded {
	var reasons []string
	fail := func(format string, args ...any) { reasons = append(reasons, fmt.Sprintf(format, args...)) }
	header := func(name string) (string, bool) {
		vs, ok := d.Header[name]
		if !ok || len(vs) == 0 {
			return "", false
		}
		return vs[0], true
	}
	text := func(name, v string) string {
		clean, ok := cleanText(v)
		if !ok {
			fail("%s: %s is not valid UTF-8 text", ReasonInvalidHeader, printable(name))
		}
		return clean
	}

	m := event.Message{Payload: d.Data, Headers: map[string]string{}}

	// The event id: the idempotency key.
	rawID, ok := header(event.HeaderEventID)
	if !ok || rawID == "" {
		rawID, ok = header(event.HeaderMsgID)
	}
	var fallback bool
	switch err := event.ValidateEventID(rawID); {
	case !ok || errors.Is(err, event.ErrMissingEventID):
		fail("%s: no %s or %s header", ReasonMissingEventID, event.HeaderEventID, event.HeaderMsgID)
		fallback = true
	case err != nil:
		fail("%s: %s", ReasonInvalidEventID, strings.TrimPrefix(err.Error(), event.ErrInvalidEventID.Error()+": "))
		m.Headers[RawEventIDHeader] = truncate(printable(rawID), 512)
		fallback = true
	default:
		m.EventID = rawID
	}
	if fallback {
		if d.Stream == "" || d.StreamSeq == 0 {
			// Without a stream position there is no stable stand-in id; the
			// caller must not store this delivery (see ReasonNoStreamSequence).
			fail("%s: cannot derive a stable event id", ReasonNoStreamSequence)
		}
		stream, _ := cleanText(d.Stream)
		m.EventID = truncate(printable(FallbackEventID(stream, d.StreamCreated, d.StreamSeq)), event.MaxEventIDLen)
	}

	// The event type, topic and key.
	if et, ok := header(event.HeaderEventType); ok && et != "" {
		m.EventType = text(event.HeaderEventType, et)
	} else {
		fail("%s: no %s header", ReasonMissingEventType, event.HeaderEventType)
	}
	if topic, ok := header(event.HeaderTopic); ok && topic != "" {
		m.Topic = text(event.HeaderTopic, topic)
	} else {
		subject := d.Subject
		if p := opts.SubjectPrefix; p != "" && strings.HasPrefix(subject, p+".") {
			subject = subject[len(p)+1:]
		}
		m.Topic = text("subject", subject)
	}
	if key, ok := header(event.HeaderKey); ok {
		m.Key = text(event.HeaderKey, key)
	}
	if ct, ok := header(event.HeaderContentType); ok {
		m.ContentType = text(event.HeaderContentType, ct)
	}

	// When the event happened.
	m.OccurredAt = d.Timestamp
	if at, ok := header(event.HeaderOccurredAt); ok {
		t, err := time.Parse(time.RFC3339Nano, at)
		if err == nil {
			t, err = event.NormalizeOccurredAt(t)
			if err != nil {
				// Never replaced by another time: stored dead, saying why.
				fail("%s: %s %q is out of range (after 0001-01-01T00:00:00Z, at most 9999-12-31T23:59:59.999999Z)",
					ReasonInvalidOccurredAt, event.HeaderOccurredAt, truncate(printable(at), 64))
			} else {
				m.OccurredAt = t
			}
		} else {
			fail("%s: %s %q is not RFC 3339", ReasonInvalidOccurredAt, event.HeaderOccurredAt, truncate(printable(at), 64))
		}
	}
	if m.OccurredAt.IsZero() {
		m.OccurredAt = time.Unix(0, 0).UTC()
	}

	// The message's own headers travel as Pgrelay-H-<name>; causation and
	// correlation as themselves.
	names := make([]string, 0, len(d.Header))
	for name := range d.Header {
		names = append(names, name)
	}
	sort.Strings(names) // deterministic reasons
	for _, name := range names {
		if (name == event.HeaderCausationID || name == event.HeaderCorrelationID) && len(d.Header[name]) > 0 {
			// Causation and correlation travel under their own names and
			// are kept in Headers under the same names.
			m.Headers[name] = text(name, d.Header[name][0])
			continue
		}
		if !strings.HasPrefix(name, event.HeaderPrefix) || len(d.Header[name]) == 0 {
			continue
		}
		k := text(name, strings.TrimPrefix(name, event.HeaderPrefix))
		m.Headers[k] = text(name, d.Header[name][0])
	}

	// The payload is kept as received, whatever is wrong with it.
	if opts.MaxPayloadBytes > 0 && len(d.Data) > opts.MaxPayloadBytes {
		fail("%s: %d bytes, the limit is %d", ReasonPayloadTooLarge, len(d.Data), opts.MaxPayloadBytes)
	} else if event.IsTextContentType(m.ContentType) && !utf8.Valid(d.Data) {
		// Only a payload declared text must be text: any other is opaque
		// bytes (protobuf, Avro) and stored as received.
		fail("%s: content type %q", ReasonPayloadNotUTF8, truncate(printable(m.ContentType), 128))
	}

	return Decoded{Message: m, DeadReason: strings.Join(reasons, "; ")}
}

// cleanText makes s storable as PostgreSQL text and jsonb: valid UTF-8 with no
// NUL byte. ok reports whether s already was.
func cleanText(s string) (clean string, ok bool) {
	if utf8.ValidString(s) && !strings.ContainsRune(s, 0) {
		return s, true
	}
	s = strings.ToValidUTF8(s, "\uFFFD")
	return strings.ReplaceAll(s, "\x00", "\uFFFD"), false
}

// printable quotes control characters and invalid bytes so that s can be shown
// and stored safely.
func printable(s string) string {
	ok := utf8.ValidString(s)
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			ok = false
			break
		}
	}
	if ok {
		return s
	}
	q := strconv.QuoteToASCII(s)
	return q[1 : len(q)-1]
}

// truncate shortens s to at most n bytes without splitting a UTF-8 sequence.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}
