package broker_test

import (
	"strings"
	"testing"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/internal/event"
)

// TestDecodeTraceContext: the traceparent and tracestate headers become the
// message's trace context; one that could not be stored is dropped, never
// making the message dead; EncodeHeaders writes them only when set.
func TestDecodeTraceContext(t *testing.T) {
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	base := func(h map[string]string) broker.Received {
		r := broker.Received{Headers: map[string][]string{event.HeaderEventID: {"e1"}, event.HeaderEventType: {"T"}}, Topic: "orders", FallbackID: "f"}
		for k, v := range h {
			r.Headers[k] = []string{v}
		}
		return r
	}
	for _, c := range []struct {
		name          string
		headers       map[string]string
		parent, state string
	}{
		{"both", map[string]string{"traceparent": tp, "tracestate": "a=1"}, tp, "a=1"},
		{"none", nil, "", ""},
		{"state without parent", map[string]string{"tracestate": "a=1"}, "", ""},
		{"parent too long", map[string]string{"traceparent": strings.Repeat("a", 256), "tracestate": "a=1"}, "", ""},
		{"state too long", map[string]string{"traceparent": tp, "tracestate": strings.Repeat("a", 4097)}, tp, ""},
		{"line break", map[string]string{"traceparent": tp + "\n"}, "", ""},
	} {
		d, err := broker.Decode(base(c.headers), broker.DecodeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if d.DeadReason != "" {
			t.Fatalf("%s: dead: %s", c.name, d.DeadReason)
		}
		if d.Message.TraceParent != c.parent || d.Message.TraceState != c.state {
			t.Fatalf("%s: trace context %q/%q, want %q/%q", c.name, d.Message.TraceParent, d.Message.TraceState, c.parent, c.state)
		}
		if len(d.Message.Headers) != 0 {
			t.Fatalf("%s: headers %v: the trace context is no header of the message's own", c.name, d.Message.Headers)
		}
	}
	h := broker.EncodeHeaders(pgrelay.Message{EventID: "e1", Topic: "orders"})
	if _, ok := h[broker.HeaderTraceParent]; ok {
		t.Fatal("traceparent written for a message without a trace context")
	}
	h = broker.EncodeHeaders(pgrelay.Message{EventID: "e1", Topic: "orders", TraceParent: tp, TraceState: "a=1"})
	if h["traceparent"] != tp || h["tracestate"] != "a=1" {
		t.Fatalf("headers %v", h)
	}
}
