package brokertest

import (
	"bytes"
	"maps"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/internal/event"
)

// FuzzRoundTrip fuzzes an adapter's mapping of an event onto its broker's
// message and back: roundTrip encodes m as the adapter's publisher does and
// decodes the result as its subscriber does, without a broker in between.
// Whatever the event, the delivery must be storable (valid event id, text
// valid UTF-8 without NUL) and never panic; a well-formed event must come
// back unchanged and usable.
func FuzzRoundTrip(f *testing.F, roundTrip func(t *testing.T, m pgrelay.Message) broker.Delivery) {
	f.Add("evt-1", "orders", "order-1", "OrderPaid", "application/json", "Trace-Id", "abc", []byte(`{"a":1}`), int64(1700000000), int64(5))
	f.Add("", "", "", "", "", "", "", []byte(nil), int64(0), int64(0))
	f.Add("e\x00", "a.b", "k\r\nNats-Msg-Id: forged", "T\xff", "text/plain", "Event-Id", "x\r\ny", []byte{0, 0xff}, int64(-1), int64(-1))
	f.Add(strings.Repeat("é", 300), "t", "'; DROP TABLE pgrelay.outbox; --", "\"", "application/octet-stream", "Pgrelay-Causation-Id", "v", []byte{0xff}, int64(1<<40), int64(999999999))
	f.Fuzz(func(t *testing.T, id, topic, key, typ, ct, hname, hval string, payload []byte, unix, nanos int64) {
		m := pgrelay.Message{EventID: id, Topic: topic, Key: key, EventType: typ, ContentType: ct, Payload: payload,
			OccurredAt: time.Unix(unix, nanos%1e9).UTC()}
		if hname != "" {
			m.Headers = map[string]string{hname: hval}
		}
		d := roundTrip(t, m)
		if err := event.ValidateEventID(d.Message.EventID); err != nil {
			t.Fatalf("event id %q not storable: %v", d.Message.EventID, err)
		}
		storable := func(what, s string) {
			if !utf8.ValidString(s) || strings.ContainsRune(s, 0) {
				t.Fatalf("%s %q not storable", what, s)
			}
		}
		storable("topic", d.Message.Topic)
		storable("key", d.Message.Key)
		storable("event type", d.Message.EventType)
		storable("content type", d.Message.ContentType)
		storable("dead reason", d.DeadReason)
		for k, v := range d.Message.Headers {
			storable("header name", k)
			storable("header value", v)
		}
		if !bytes.Equal(d.Message.Payload, payload) {
			t.Fatal("payload changed")
		}
		if !wellFormed(m) {
			return
		}
		if d.DeadReason != "" {
			t.Fatalf("a well-formed event came back dead: %s", d.DeadReason)
		}
		want := m
		want.OccurredAt, _ = event.NormalizeOccurredAt(m.OccurredAt)
		if d.Message.EventID != want.EventID || d.Message.Topic != want.Topic || d.Message.Key != want.Key ||
			d.Message.EventType != want.EventType || d.Message.ContentType != want.ContentType ||
			!d.Message.OccurredAt.Equal(want.OccurredAt) {
			t.Fatalf("round trip changed the event:\n got %+v\nwant %+v", d.Message, want)
		}
		if !maps.Equal(d.Message.Headers, want.Headers) && len(d.Message.Headers)+len(want.Headers) > 0 {
			t.Fatalf("headers %v, want %v", d.Message.Headers, want.Headers)
		}
	})
}

// wellFormed reports whether m is an event the relay publishes and the
// consumer must accept unchanged.
func wellFormed(m pgrelay.Message) bool {
	clean := func(s string) bool {
		if !utf8.ValidString(s) {
			return false
		}
		for _, r := range s {
			if r < 0x20 || r == 0x7f {
				return false
			}
		}
		return true
	}
	if event.ValidateEventID(m.EventID) != nil || m.EventType == "" || m.Topic == "" {
		return false
	}
	if _, err := event.NormalizeOccurredAt(m.OccurredAt); err != nil || m.OccurredAt.IsZero() {
		return false
	}
	for _, s := range []string{m.Topic, m.Key, m.EventType, m.ContentType} {
		if !clean(s) || strings.TrimSpace(s) != s {
			return false
		}
	}
	for k, v := range m.Headers {
		if k == "" || !clean(k) || !clean(v) || strings.ContainsAny(k, " :") || strings.TrimSpace(v) != v {
			return false
		}
		if strings.EqualFold(k, event.HeaderContentType) {
			return false
		}
	}
	if event.IsTextContentType(m.ContentType) && !utf8.Valid(m.Payload) {
		return false
	}
	return true
}
