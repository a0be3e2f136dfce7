package broker

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/event"
)

// Reasons a delivery is stored dead at ingest, the same for every broker.
// They start the DeadReason text, followed by details.
const (
	ReasonMissingEventID    = "missing event id"
	ReasonInvalidEventID    = "invalid event id"
	ReasonMissingEventType  = "missing event type"
	ReasonInvalidHeader     = "invalid header"
	ReasonInvalidOccurredAt = "invalid occurred-at"
	ReasonInvalidExpiresAt  = "invalid expires-at"
	ReasonInvalidKeySeq     = "invalid key sequence"
	ReasonKeyTooLong        = "key too long"
	ReasonPayloadTooLarge   = "payload too large"
	ReasonPayloadNotUTF8    = "payload is not valid UTF-8"
)

// RawEventIDHeader is the inbox header that keeps an unusable event id as
// received (made printable), next to the stand-in id the row is stored under.
const RawEventIDHeader = "Pgrelay-Raw-Event-Id"

// RawKeyHeader is the inbox header that keeps the start of a key longer than
// event.MaxKeyLen (made printable) on the dead row, which is stored without a
// key.
const RawKeyHeader = "Pgrelay-Raw-Key"

// ErrNoStableID is Decode's refusal of a delivery that has no usable event id
// and no broker position to derive a stand-in from: storing it under a guess
// could store one message twice, so the adapter leaves it unacknowledged and
// logs it.
var ErrNoStableID = errors.New("no usable event id and no broker position to derive a stable one from")

// Received is a message as an adapter read it off its broker, in pgrelay's
// logical form: what Decode reads.
type Received struct {
	// Headers holds pgrelay's logical headers (event.HeaderEventID,
	// event.HeaderTopic, ..., the message's own headers under
	// event.HeaderPrefix, causation and correlation under their own names),
	// mapped by the adapter from wherever its broker carries them.
	Headers map[string][]string
	// Payload is the message body.
	Payload []byte
	// BrokerID is the broker's own message id (Nats-Msg-Id, AMQP
	// message-id), which stands in for a missing event id header; empty when
	// the broker has none. BrokerIDName names it in dead reasons.
	BrokerID, BrokerIDName string
	// Topic is the topic the broker's destination implies (a subject without
	// its prefix, a Kafka topic), used when the message has no topic header.
	Topic string
	// FallbackID is the stable stand-in id derived from the delivery's
	// broker position (the same on every redelivery), given to a message
	// without a usable event id; empty when there is none.
	FallbackID string
	// Timestamp is when the broker stored the message; it stands in for a
	// missing occurred-at header.
	Timestamp time.Time
}

// DecodeOptions are the limits Decode applies.
type DecodeOptions struct {
	// MaxPayloadBytes is the largest accepted payload; a larger one is stored
	// dead. Zero means no limit.
	MaxPayloadBytes int
}

// EncodeHeaders returns pgrelay's logical headers for m: the ones Decode
// reads back. An adapter maps them onto its broker (or carries some, such as
// the event id, in a field of its own and puts them back before Decode).
func EncodeHeaders(m pgrelay.Message) map[string]string {
	h := make(map[string]string, len(m.Headers)+6)
	h[event.HeaderEventID] = m.EventID
	h[event.HeaderTopic] = m.Topic
	h[event.HeaderKey] = m.Key
	if m.KeySeq > 0 {
		h[event.HeaderKeySeq] = strconv.FormatInt(m.KeySeq, 10)
	}
	if m.EventType != "" {
		h[event.HeaderEventType] = m.EventType
	}
	if !m.OccurredAt.IsZero() {
		h[event.HeaderOccurredAt] = m.OccurredAt.UTC().Format(time.RFC3339Nano)
	}
	if !m.ExpiresAt.IsZero() {
		h[event.HeaderExpiresAt] = m.ExpiresAt.UTC().Format(time.RFC3339Nano)
	}
	for k, v := range m.Headers {
		if k == event.HeaderCausationID || k == event.HeaderCorrelationID || k == event.HeaderContentType {
			h[k] = v // pgrelay's own headers, under their own names
			continue
		}
		h[event.HeaderPrefix+k] = v
	}
	if m.ContentType != "" {
		h[event.HeaderContentType] = m.ContentType
	}
	encodeTraceHeaders(h, m)
	return h
}

// Decode turns a received message into the delivery to store (Ref, Ack and
// InProgress are the adapter's to set). A message it cannot use comes back
// with DeadReason set, its raw payload kept, so that the consumer stores it
// dead, acknowledges it and moves on; the only error is ErrNoStableID.
//
// Decode checks what the transport carries: the event id (Pgrelay-Event-Id,
// else the broker's message id), the event type header, the occurred-at
// header, header text, the payload size and, when the content type
// (Pgrelay-Content-Type) says text or JSON, that the payload is UTF-8; any
// other payload is opaque bytes (protobuf, Avro), stored as received. It does
// not look inside the payload: the handler owns the payload's schema and
// reports a bad shape or an unknown event type as a permanent failure.
//
// A message in CloudEvents binary mode (a specversion header under "ce-",
// "ce_", "cloudEvents_" or "cloudEvents:") is read from its attributes
// first (see CloudEventsHeaders for the mapping; a specversion other than
// 1.0, or no id, source or type, adds a reason), so every adapter reads both
// wire formats.
func Decode(r Received, opts DecodeOptions) (Delivery, error) {
	d := &decoder{r: r, m: pgrelay.Message{Payload: r.Payload, Headers: map[string]string{}}}
	if ce := detectCloudEvent(r.Headers); ce != nil {
		d.fromCloudEvent(ce)
	}
	if err := d.eventID(); err != nil {
		return Delivery{}, err
	}
	d.eventTypeAndTopic()
	d.key()
	d.contentType()
	d.occurredAt()
	d.expiresAt()
	d.ownHeaders()
	d.traceContext()
	d.payload(opts)
	return Delivery{Message: d.m, DeadReason: strings.Join(d.reasons, "; ")}, nil
}

// decoder is one Decode call's state: the received message, the message
// decoded so far, and the reasons found, in the order of Decode's steps, for
// storing it dead.
type decoder struct {
	r       Received
	m       pgrelay.Message
	reasons []string
	// ce is the CloudEvent the delivery carries in binary mode, nil for
	// pgrelay's own format; dead reasons then name its attributes.
	ce *cloudEvent
}

// fail adds a reason the message is stored dead.
func (d *decoder) fail(format string, args ...any) {
	d.reasons = append(d.reasons, fmt.Sprintf(format, args...))
}

// header returns the first value of the received header name; ok is false
// when it is absent or has no value.
func (d *decoder) header(name string) (string, bool) {
	vs, ok := d.r.Headers[name]
	if !ok || len(vs) == 0 {
		return "", false
	}
	return vs[0], true
}

// text returns v, the value of header name, made storable; a value that was
// not storable text adds a reason.
func (d *decoder) text(name, v string) string {
	clean, ok := StorableText(v)
	if !ok {
		d.fail("%s: %s is not valid UTF-8 text", ReasonInvalidHeader, Printable(name))
	}
	return clean
}

// eventID sets the event id: the idempotency key. It is the event id header,
// else the broker's message id; a missing or invalid one adds a reason and
// is replaced by the stand-in derived from the broker position (the invalid
// one kept, printable, in RawEventIDHeader). Without a stand-in it returns
// ErrNoStableID. The id set is always valid.
func (d *decoder) eventID() error {
	rawID, ok := d.header(event.HeaderEventID)
	if !ok || rawID == "" {
		rawID, ok = d.r.BrokerID, d.r.BrokerID != ""
	}
	var fallback bool
	switch err := event.ValidateEventID(rawID); {
	case !ok || errors.Is(err, event.ErrMissingEventID):
		if d.ce != nil {
			d.fail("%s: no %s attribute", ReasonMissingEventID, d.ce.attrName(ceID))
		} else if d.r.BrokerIDName != "" {
			d.fail("%s: no %s or %s header", ReasonMissingEventID, event.HeaderEventID, d.r.BrokerIDName)
		} else {
			d.fail("%s: no %s header", ReasonMissingEventID, event.HeaderEventID)
		}
		fallback = true
	case err != nil:
		d.fail("%s: %s", ReasonInvalidEventID, strings.TrimPrefix(err.Error(), event.ErrInvalidEventID.Error()+": "))
		d.m.Headers[RawEventIDHeader] = Truncate(Printable(rawID), 512)
		fallback = true
	default:
		d.m.EventID = rawID
	}
	if fallback {
		if d.r.FallbackID == "" {
			return ErrNoStableID
		}
		id, _ := StorableText(d.r.FallbackID)
		d.m.EventID = Truncate(Printable(id), event.MaxEventIDLen)
	}
	return nil
}

// eventTypeAndTopic sets the event type (a missing one adds a reason) and the
// topic (the topic header, else the one the broker's destination implies).
func (d *decoder) eventTypeAndTopic() {
	if et, ok := d.header(event.HeaderEventType); ok && et != "" {
		d.m.EventType = d.text(event.HeaderEventType, et)
	} else if d.ce != nil {
		d.fail("%s: no %s attribute", ReasonMissingEventType, d.ce.attrName(ceType))
	} else {
		d.fail("%s: no %s header", ReasonMissingEventType, event.HeaderEventType)
	}
	if topic, ok := d.header(event.HeaderTopic); ok && topic != "" {
		d.m.Topic = d.text(event.HeaderTopic, topic)
	} else {
		d.m.Topic = d.text("destination", d.r.Topic)
	}
}

// key sets the key and its sequence. A key over event.MaxKeyLen is dropped,
// its start kept in RawKeyHeader, and its sequence ignored; a sequence that
// is not a positive integer, or has no key, adds a reason and is not set.
func (d *decoder) key() {
	keyTooLong := false
	if key, ok := d.header(event.HeaderKey); ok {
		d.m.Key = d.text(event.HeaderKey, key)
		if len(d.m.Key) > event.MaxKeyLen {
			// No key index could hold it (a producer publishing straight to
			// the broker): stored dead without a key, its start kept.
			d.fail("%s: %s is %d bytes, the limit is %d", ReasonKeyTooLong, event.HeaderKey, len(d.m.Key), event.MaxKeyLen)
			d.m.Headers[RawKeyHeader] = Truncate(Printable(d.m.Key), 256)
			d.m.Key, keyTooLong = "", true
		}
	}
	if seq, ok := d.header(event.HeaderKeySeq); ok && !keyTooLong {
		// A sequence the consumer cannot read would silently break a key's
		// order: the delivery is stored dead, saying why.
		n, err := strconv.ParseInt(seq, 10, 64)
		switch {
		case err != nil || n <= 0:
			d.fail("%s: %s %q is not a positive decimal integer", ReasonInvalidKeySeq, event.HeaderKeySeq, Truncate(Printable(seq), 64))
		case d.m.Key == "":
			d.fail("%s: %s %d without a %s header", ReasonInvalidKeySeq, event.HeaderKeySeq, n, event.HeaderKey)
		default:
			d.m.KeySeq = n
		}
	}
}

// contentType sets the content type from its header, when there is one.
func (d *decoder) contentType() {
	if ct, ok := d.header(event.HeaderContentType); ok {
		d.m.ContentType = d.text(event.HeaderContentType, ct)
	}
}

// occurredAt sets when the event happened: the occurred-at header, else the
// broker's timestamp, else the Unix epoch; never zero. A header that cannot
// be read or is out of range adds a reason.
func (d *decoder) occurredAt() {
	d.m.OccurredAt = d.r.Timestamp
	if at, ok := d.header(event.HeaderOccurredAt); ok {
		t, err := time.Parse(time.RFC3339Nano, at)
		if err == nil {
			t, err = event.NormalizeOccurredAt(t)
			if err != nil {
				// Never replaced by another time: stored dead, saying why.
				d.fail("%s: %s %q is out of range (after 0001-01-01T00:00:00Z, at most 9999-12-31T23:59:59.999999Z)",
					ReasonInvalidOccurredAt, event.HeaderOccurredAt, Truncate(Printable(at), 64))
			} else {
				d.m.OccurredAt = t
			}
		} else {
			d.fail("%s: %s %q is not RFC 3339", ReasonInvalidOccurredAt, event.HeaderOccurredAt, Truncate(Printable(at), 64))
		}
	}
	if d.m.OccurredAt.IsZero() {
		d.m.OccurredAt = time.Unix(0, 0).UTC()
	}
}

// expiresAt sets the event's expiry from its header, when there is one. A
// header that cannot be read adds a reason: an expiry silently dropped would
// let the event be applied after it.
func (d *decoder) expiresAt() {
	at, ok := d.header(event.HeaderExpiresAt)
	if !ok {
		return
	}
	t, err := time.Parse(time.RFC3339Nano, at)
	if err == nil {
		t, err = event.NormalizeOccurredAt(t)
	}
	if err != nil {
		d.fail("%s: %s %q is not an RFC 3339 time in range", ReasonInvalidExpiresAt, event.HeaderExpiresAt, Truncate(Printable(at), 64))
		return
	}
	d.m.ExpiresAt = t
}

// ownHeaders sets the message's own headers, made storable, visiting the
// received headers in name order so that reasons come out the same every
// time.
func (d *decoder) ownHeaders() {
	// The message's own headers travel as Pgrelay-H-<name>; causation and
	// correlation as themselves.
	names := make([]string, 0, len(d.r.Headers))
	for name := range d.r.Headers {
		names = append(names, name)
	}
	sort.Strings(names) // deterministic reasons
	for _, name := range names {
		if (name == event.HeaderCausationID || name == event.HeaderCorrelationID) && len(d.r.Headers[name]) > 0 {
			d.m.Headers[name] = d.text(name, d.r.Headers[name][0])
			continue
		}
		if !strings.HasPrefix(name, event.HeaderPrefix) || len(d.r.Headers[name]) == 0 {
			continue
		}
		k := d.text(name, strings.TrimPrefix(name, event.HeaderPrefix))
		d.m.Headers[k] = d.text(name, d.r.Headers[name][0])
	}
}

// payload checks the payload's size against opts and, when the content type
// says text or JSON, that it is UTF-8: either failure adds a reason.
func (d *decoder) payload(opts DecodeOptions) {
	// The payload is kept as received, whatever is wrong with it.
	if opts.MaxPayloadBytes > 0 && len(d.r.Payload) > opts.MaxPayloadBytes {
		d.fail("%s: %d bytes, the limit is %d", ReasonPayloadTooLarge, len(d.r.Payload), opts.MaxPayloadBytes)
	} else if event.IsTextContentType(d.m.ContentType) && !utf8.Valid(d.r.Payload) {
		// Only a payload declared text must be text: any other is opaque
		// bytes (protobuf, Avro) and stored as received.
		d.fail("%s: content type %q", ReasonPayloadNotUTF8, Truncate(Printable(d.m.ContentType), 128))
	}
}

// StorableText makes s storable as PostgreSQL text and jsonb: valid UTF-8
// with no NUL byte. ok reports whether s already was.
func StorableText(s string) (clean string, ok bool) {
	if utf8.ValidString(s) && !strings.ContainsRune(s, 0) {
		return s, true
	}
	s = strings.ToValidUTF8(s, "\uFFFD")
	return strings.ReplaceAll(s, "\x00", "\uFFFD"), false
}

// Printable quotes control characters and invalid bytes so that s can be
// shown and stored safely.
func Printable(s string) string {
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

// Truncate shortens s to at most n bytes without splitting a UTF-8 sequence.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}
