package broker

import (
	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/event"
)

// Trace context headers: the W3C Trace Context names
// (https://www.w3.org/TR/trace-context/), under which every adapter carries
// Message.TraceParent and Message.TraceState, as instrumentation libraries
// expect them.
const (
	HeaderTraceParent = event.HeaderTraceParent
	HeaderTraceState  = event.HeaderTraceState
)

// encodeTraceHeaders adds m's trace context, when it has one, to the logical
// headers h.
func encodeTraceHeaders(h map[string]string, m pgrelay.Message) {
	if m.TraceParent != "" {
		h[HeaderTraceParent] = m.TraceParent
	}
	if m.TraceState != "" {
		h[HeaderTraceState] = m.TraceState
	}
}

// traceContext sets the message's trace context from the traceparent and
// tracestate headers. A trace context that could not be stored (too long,
// not text) is dropped: it never makes the message dead, it only loses the
// link to the producer's trace.
func (d *decoder) traceContext() {
	tp, _ := d.header(HeaderTraceParent)
	ts, _ := d.header(HeaderTraceState)
	if tp == "" {
		return // a tracestate means nothing without its traceparent
	}
	if event.ValidTraceContext(tp, ts) != "" {
		if event.ValidTraceContext(tp, "") != "" {
			return
		}
		ts = ""
	}
	d.m.TraceParent, d.m.TraceState = tp, ts
}
