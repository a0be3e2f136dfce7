package otelpgrelay

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
)

// NewPublisher returns a broker.Publisher that publishes through p and
// records a send span per message (span kind producer, named "send
// <topic>"), a child of the producer's context the message carries and
// linked to it, ended when the broker acknowledged the message or refused
// it (then with status Error). A message without a trace context gets a send
// span of its own trace. The message's traceparent and tracestate headers
// are the producer's, as stored: the consumer's process span is the
// producer's child, beside the send span.
func NewPublisher(p broker.Publisher, opts ...Option) broker.Publisher {
	c := newConfig(opts)
	return &publisher{p: p, cfg: c, tracer: c.tracer()}
}

type publisher struct {
	p      broker.Publisher
	cfg    config
	tracer trace.Tracer
}

func (p *publisher) Publish(ctx context.Context, msgs []pgrelay.Message) []broker.Result {
	spans := make([]trace.Span, len(msgs))
	for i, m := range msgs {
		spans[i] = p.startSend(ctx, m)
	}
	results := p.p.Publish(ctx, msgs)
	for i, span := range spans {
		if i < len(results) {
			if r := results[i]; r.Err != nil {
				span.RecordError(r.Err)
				span.SetStatus(codes.Error, r.Err.Error())
			} else if r.Duplicate {
				span.SetAttributes(attribute.Bool("pgrelay.duplicate", true))
			}
		}
		span.End()
	}
	return results
}

// startSend starts m's send span.
func (p *publisher) startSend(ctx context.Context, m pgrelay.Message) trace.Span {
	attrs := p.cfg.systemAttrs(make([]attribute.KeyValue, 0, 6))
	attrs = append(attrs,
		semconv.MessagingOperationTypeSend,
		semconv.MessagingOperationName("send"),
		semconv.MessagingDestinationName(m.Topic),
		semconv.MessagingMessageID(m.EventID),
		semconv.MessagingMessageBodySize(len(m.Payload)),
	)
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...)}
	sc := parseTraceContext(m.TraceParent, m.TraceState)
	if sc.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, sc)
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
	} else {
		opts = append(opts, trace.WithNewRoot())
	}
	_, span := p.tracer.Start(ctx, "send "+m.Topic, opts...)
	return span
}

func (p *publisher) Close() error { return p.p.Close() }
