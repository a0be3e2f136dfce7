package pgrelay

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/pgrelay/pgrelay/internal/event"
)

// FuzzValidate checks Enqueue's validation against arbitrary messages: it
// never panics, and what it accepts is safe to publish: the topic is a broker
// subject of non-empty plain tokens (no spaces, wildcards or control bytes),
// a given event id passes ValidateEventID, header names are plain tokens, and
// header values, the key and the event type hold no line break.
func FuzzValidate(f *testing.F) {
	f.Add("orders", "evt-1", "Trace-Id", "abc", 10)
	f.Add("", "", "", "", 0)
	f.Add("orders.*", "e\x00", "A B", "x\r\ny", 5)
	f.Add("a..b", "\xff", "Ok", "v", 1<<21)
	f.Add("orders.>", strings.Repeat("x", 300), "h\n", "'; DROP TABLE pgrelay.outbox; --", 3)
	o, err := NewOutbox(OutboxConfig{MaxPayloadBytes: 1 << 20})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, topic, id, hname, hval string, size int) {
		if size < 0 || size > 2<<20 {
			return
		}
		m := Message{Topic: topic, EventID: id, Key: hval, EventType: hname, Payload: make([]byte, size)}
		if hname != "" {
			m.Headers = map[string]string{hname: hval}
		}
		err := o.validate(m)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("an error without a message")
			}
			return
		}
		if topic == "" || !utf8.ValidString(topic) || strings.ContainsAny(topic, " \t\r\n*>\x00") ||
			strings.HasPrefix(topic, ".") || strings.HasSuffix(topic, ".") || strings.Contains(topic, "..") {
			t.Fatalf("accepted topic %q", topic)
		}
		if id != "" && event.ValidateEventID(id) != nil {
			t.Fatalf("accepted event id %q", id)
		}
		if size > 1<<20 {
			t.Fatalf("accepted a %d-byte payload", size)
		}
		if strings.ContainsAny(hname, "\r\n") || strings.ContainsAny(hval, "\r\n") {
			t.Fatalf("accepted a line break in the key %q or event type %q", hval, hname)
		}
		if hname != "" && strings.ContainsAny(hname, " :\x00") {
			t.Fatalf("accepted header %q: %q", hname, hval)
		}
	})
}
