package event

import (
	"strings"
	"unicode/utf8"
)

// The W3C Trace Context header names (https://www.w3.org/TR/trace-context/)
// under which Message.TraceParent and Message.TraceState travel on every
// broker, and under which the inbox keeps them in its headers column.
const (
	HeaderTraceParent = "traceparent"
	HeaderTraceState  = "tracestate"
)

// The longest trace context the outbox stores, in bytes: the bounds of the
// outbox table's outbox_trace_context_length constraint (migration 00101). A
// version-00 traceparent is 55 bytes; the W3C recommends propagating at least
// 512 bytes of tracestate.
const (
	MaxTraceParentLen = 255
	MaxTraceStateLen  = 4096
)

// ValidTraceContext reports why a trace context cannot be stored and carried
// as broker headers: too long, or not text without NUL and line breaks; ""
// when it can.
func ValidTraceContext(traceParent, traceState string) string {
	switch {
	case len(traceParent) > MaxTraceParentLen:
		return "trace context: TraceParent is longer than 255 bytes"
	case len(traceState) > MaxTraceStateLen:
		return "trace context: TraceState is longer than 4096 bytes"
	case !utf8.ValidString(traceParent) || !utf8.ValidString(traceState):
		return "trace context is not valid UTF-8"
	case strings.ContainsAny(traceParent, "\x00\r\n"), strings.ContainsAny(traceState, "\x00\r\n"):
		return "trace context contains a NUL character or a line break"
	}
	return ""
}
