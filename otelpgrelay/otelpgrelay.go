// Package otelpgrelay traces pgrelay events with OpenTelemetry: one trace
// from the producer's request to the handler that applies the event.
//
// The producer's trace context is captured when the event is enqueued, not
// when it is relayed: Enqueue (or Inject) stores the W3C traceparent and
// tracestate of the span in ctx with the event, in the outbox's traceparent
// and tracestate columns. The relay publishes them as the broker headers of
// those names on every broker (NATS, Kafka, RabbitMQ); NewPublisher records a
// send span per event, a child of (and linked to) the producer's context.
// The consumer keeps them with the inbox row, and NewHandler runs the handler
// under a process span parented to them, so a retry hours later still joins
// the producer's trace. The spans carry the OpenTelemetry messaging semantic
// conventions (messaging.system, messaging.destination.name,
// messaging.message.id, messaging.operation.type and .name).
//
//	// producer, in the request's transaction (ctx holds the request's span)
//	err := otelpgrelay.Enqueue(ctx, tx, pgrelay.Message{Topic: "orders", EventType: "OrderPlaced", Payload: body})
//
//	// relay
//	cfg.Publisher = otelpgrelay.NewPublisher(pub, otelpgrelay.WithSystem("nats"))
//
//	// consumer
//	cfg.Inbox.Handler = otelpgrelay.NewHandler(handler, otelpgrelay.WithSystem("nats"))
//
// The root package pgrelay does not depend on OpenTelemetry: its Message
// carries the trace context as two strings (Message.TraceParent,
// Message.TraceState), which a producer using another tracing library, or
// plain SQL, sets itself. Without a tracer provider (the global default is
// OpenTelemetry's no-op one) the only cost is the header: no span is
// recorded and nothing is exported. See docs/tracing.md.
package otelpgrelay

import (
	"context"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgrelay/pgrelay"
)

// ScopeName is the instrumentation scope of the tracers this package uses.
const ScopeName = "github.com/pgrelay/pgrelay/otelpgrelay"

// Option configures NewPublisher and NewHandler.
type Option func(*config)

type config struct {
	provider trace.TracerProvider
	system   string
}

// WithTracerProvider sets the tracer provider the spans are recorded with.
// Default: otel.GetTracerProvider() when the publisher or handler is made.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.provider = tp }
}

// WithSystem sets the messaging.system attribute: "nats", "kafka" or
// "rabbitmq" (semconv's values for the broker in use). Default: none.
func WithSystem(system string) Option {
	return func(c *config) { c.system = system }
}

func newConfig(opts []Option) config {
	var c config
	for _, o := range opts {
		o(&c)
	}
	if c.provider == nil {
		c.provider = otel.GetTracerProvider()
	}
	return c
}

func (c config) tracer() trace.Tracer { return c.provider.Tracer(ScopeName) }

func (c config) systemAttrs(attrs []attribute.KeyValue) []attribute.KeyValue {
	if c.system != "" {
		attrs = append(attrs, semconv.MessagingSystemKey.String(c.system))
	}
	return attrs
}

// TraceContext returns the W3C traceparent and tracestate of the span
// context in ctx, or "" and "" when ctx holds no valid one (no span, or the
// no-op provider's).
func TraceContext(ctx context.Context) (traceParent, traceState string) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return "", ""
	}
	var c traceCarrier
	w3c.Inject(ctx, &c)
	return c.parent, c.state
}

// Inject returns copies of msgs carrying the trace context of the span in
// ctx (Message.TraceParent and TraceState), for Enqueue or
// (*pgrelay.Outbox).Enqueue. A message that already has a TraceParent keeps
// its own. Without a valid span context in ctx, it returns msgs as they are.
func Inject(ctx context.Context, msgs ...pgrelay.Message) []pgrelay.Message {
	tp, ts := TraceContext(ctx)
	if tp == "" {
		return msgs
	}
	out := make([]pgrelay.Message, len(msgs))
	for i, m := range msgs {
		if m.TraceParent == "" {
			m.TraceParent, m.TraceState = tp, ts
		}
		out[i] = m
	}
	return out
}

// Enqueue is pgrelay.Enqueue with the trace context of the span in ctx
// stored with every message (see Inject): the relay publishes it and the
// consumer's handler runs in the same trace.
func Enqueue(ctx context.Context, tx pgx.Tx, msgs ...pgrelay.Message) error {
	return pgrelay.Enqueue(ctx, tx, Inject(ctx, msgs...)...)
}

// Emit is pgrelay.Emit (events written to the write-ahead log, for a relay
// capturing from the WAL) with the trace context of the span in ctx carried
// by every message (see Inject).
func Emit(ctx context.Context, tx pgx.Tx, msgs ...pgrelay.Message) error {
	return pgrelay.Emit(ctx, tx, Inject(ctx, msgs...)...)
}

// SpanContext returns the producer's span context m carries, marked remote;
// it is not valid when m has no trace context or an unreadable one.
func SpanContext(m pgrelay.Message) trace.SpanContext {
	return parseTraceContext(m.TraceParent, m.TraceState)
}

// ContextWithProducer returns ctx with m's producer span context as the
// remote parent of spans started from it, or ctx unchanged when m has none.
func ContextWithProducer(ctx context.Context, m pgrelay.Message) context.Context {
	sc := SpanContext(m)
	if !sc.IsValid() {
		return ctx
	}
	return trace.ContextWithRemoteSpanContext(ctx, sc)
}
