package nats

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/event"
)

// FuzzToNATS builds the relay's broker message from arbitrary event fields:
// it never panics, publishes to <prefix>.<topic>, carries the event's identity
// headers exactly, keeps the payload byte for byte, and an application header
// can never stand in for one of the relay's own headers.
func FuzzToNATS(f *testing.F) {
	f.Add("evt-1", "orders", "order-1", "OrderPaid", "Trace-Id", "abc", []byte(`{"a":1}`), int64(1700000000))
	f.Add("", "", "", "", "", "", []byte(nil), int64(0))
	f.Add("e\x00", "a.b", "k\r\nNats-Msg-Id: forged", "T\xff", "Event-Id", "x\r\ny", []byte{0, 0xff}, int64(-1))
	f.Add(strings.Repeat("é", 300), "t", "'; DROP TABLE pgrelay.outbox; --", "\"", "Msg-Id", "v", bytes.Repeat([]byte("x"), 70000), int64(1<<40))
	p := &Publisher{cfg: pubConfig{SubjectPrefix: "pgrelay"}}
	f.Fuzz(func(t *testing.T, id, topic, key, typ, hname, hval string, payload []byte, unix int64) {
		m := pgrelay.Message{EventID: id, Topic: topic, Key: key, EventType: typ, Payload: payload, OccurredAt: time.Unix(unix, 0)}
		if hname != "" {
			m.Headers = map[string]string{hname: hval}
		}
		msg := p.toNATS(m)
		if msg.Subject != "pgrelay."+topic {
			t.Fatalf("subject %q for topic %q", msg.Subject, topic)
		}
		if !bytes.Equal(msg.Data, payload) {
			t.Fatal("payload changed")
		}
		for h, want := range map[string]string{event.HeaderEventID: id, event.HeaderTopic: topic, event.HeaderKey: key} {
			if got := msg.Header[h]; len(got) != 1 || got[0] != want {
				t.Fatalf("header %s = %q, want %q", h, got, want)
			}
		}
		if hname != "" {
			if got := msg.Header[event.HeaderPrefix+hname]; len(got) != 1 || got[0] != hval {
				t.Fatalf("application header %q = %q, want %q", hname, got, hval)
			}
		}
		own := map[string]bool{event.HeaderEventID: true, event.HeaderTopic: true, event.HeaderKey: true,
			event.HeaderEventType: true, event.HeaderOccurredAt: true, MsgIDHeader: true}
		for h := range msg.Header {
			if !own[h] && !strings.HasPrefix(h, event.HeaderPrefix) {
				t.Fatalf("unexpected header %q", h)
			}
		}
	})
}
