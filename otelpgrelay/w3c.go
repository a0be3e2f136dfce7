package otelpgrelay

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// w3c is the W3C Trace Context propagator: the outbox columns and the broker
// headers hold that format whatever propagator the program installed
// globally.
var w3c = propagation.TraceContext{}

// traceCarrier carries one trace context through the propagator without a
// map.
type traceCarrier struct{ parent, state string }

func (c *traceCarrier) Get(key string) string {
	switch key {
	case "traceparent":
		return c.parent
	case "tracestate":
		return c.state
	}
	return ""
}

func (c *traceCarrier) Set(key, value string) {
	switch key {
	case "traceparent":
		c.parent = value
	case "tracestate":
		c.state = value
	}
}

func (c *traceCarrier) Keys() []string { return []string{"traceparent", "tracestate"} }

func parseTraceContext(parent, state string) trace.SpanContext {
	if parent == "" {
		return trace.SpanContext{}
	}
	c := traceCarrier{parent: parent, state: state}
	return trace.SpanContextFromContext(w3c.Extract(context.Background(), &c))
}
