package otelpgrelay

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgrelay/pgrelay"
)

// NewHandler returns an inbox handler that runs h under a process span per
// event (span kind consumer, named "process <topic>"), a child of the
// producer's context the event carries (a new trace when it has none), with
// the messaging attributes, messaging.consumer.group.name the inbox
// handler's name, and pgrelay.attempt the attempt number. An error ends the
// span with status Error. Events that h enqueues with the span's ctx through
// Enqueue continue the trace.
//
// The wrapper keeps what h is: an InboxBatchHandler stays one (its batch
// runs under one process span linked to every event's producer), and
// ExternalEffects reports h's.
func NewHandler(h pgrelay.InboxHandler, opts ...Option) pgrelay.InboxHandler {
	c := newConfig(opts)
	base := handler{h: h, cfg: c, tracer: c.tracer()}
	if bh, ok := h.(pgrelay.InboxBatchHandler); ok {
		return &batchHandler{handler: base, bh: bh}
	}
	return &base
}

type handler struct {
	h      pgrelay.InboxHandler
	cfg    config
	tracer trace.Tracer
}

func (h *handler) Handle(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
	attrs := h.cfg.systemAttrs(make([]attribute.KeyValue, 0, 8))
	attrs = append(attrs,
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingOperationName("process"),
		semconv.MessagingDestinationName(ev.Topic),
		semconv.MessagingMessageID(ev.EventID),
		semconv.MessagingConsumerGroupName(ev.Handler),
		semconv.MessagingMessageBodySize(len(ev.Payload)),
		attribute.Int("pgrelay.attempt", ev.Attempts),
	)
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...)}
	if sc := SpanContext(ev.Message); sc.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, sc)
	} else {
		opts = append(opts, trace.WithNewRoot())
	}
	ctx, span := h.tracer.Start(ctx, "process "+ev.Topic, opts...)
	defer span.End()
	err := h.h.Handle(ctx, tx, ev)
	setError(span, err)
	return err
}

// ExternalEffects reports the wrapped handler's (pgrelay.ExternalHandler).
func (h *handler) ExternalEffects() bool {
	e, ok := h.h.(interface{ ExternalEffects() bool })
	return ok && e.ExternalEffects()
}

// Unwrap returns the wrapped handler.
func (h *handler) Unwrap() pgrelay.InboxHandler { return h.h }

type batchHandler struct {
	handler
	bh pgrelay.InboxBatchHandler
}

func (h *batchHandler) HandleBatch(ctx context.Context, tx pgx.Tx, evs []*pgrelay.InboxEvent) error {
	links := make([]trace.Link, 0, len(evs))
	for _, ev := range evs {
		if sc := SpanContext(ev.Message); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	attrs := h.cfg.systemAttrs(make([]attribute.KeyValue, 0, 4))
	attrs = append(attrs,
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingOperationName("process"),
		semconv.MessagingBatchMessageCount(len(evs)),
	)
	name := "process"
	if len(evs) > 0 {
		attrs = append(attrs, semconv.MessagingConsumerGroupName(evs[0].Handler))
		if sameTopic(evs) {
			name += " " + evs[0].Topic
			attrs = append(attrs, semconv.MessagingDestinationName(evs[0].Topic))
		}
	}
	ctx, span := h.tracer.Start(ctx, name, trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithLinks(links...), trace.WithAttributes(attrs...))
	defer span.End()
	err := h.bh.HandleBatch(ctx, tx, evs)
	setError(span, err)
	return err
}

func sameTopic(evs []*pgrelay.InboxEvent) bool {
	for _, ev := range evs[1:] {
		if ev.Topic != evs[0].Topic {
			return false
		}
	}
	return true
}

// setError marks span failed with err, unless err is nil or a Defer (the
// event waits for a dependency, which is no failure).
func setError(span trace.Span, err error) {
	if err == nil {
		return
	}
	var d *pgrelay.DeferError
	if errors.As(err, &d) {
		span.SetAttributes(attribute.Bool("pgrelay.deferred", true))
		return
	}
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
}
