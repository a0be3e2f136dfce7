package otelpgrelay_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/otelpgrelay"
)

type batchHandler struct{ batches [][]*pgrelay.InboxEvent }

func (b *batchHandler) Handle(context.Context, pgx.Tx, *pgrelay.InboxEvent) error { return nil }
func (b *batchHandler) HandleBatch(_ context.Context, _ pgx.Tx, evs []*pgrelay.InboxEvent) error {
	b.batches = append(b.batches, evs)
	return nil
}

type externalHandler struct{}

func (externalHandler) Handle(context.Context, pgx.Tx, *pgrelay.InboxEvent) error { return nil }
func (externalHandler) ExternalEffects() bool                                     { return true }

// TestHandlerKeepsWhatItWraps: the wrapper of a batch handler is a batch
// handler, whose batch runs under one process span linked to each event's
// producer; the wrapper of a plain handler is not one; ExternalEffects is
// the wrapped handler's; a Defer is no failure.
func TestHandlerKeepsWhatItWraps(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	inner := &batchHandler{}
	h := otelpgrelay.NewHandler(inner, otelpgrelay.WithTracerProvider(tp), otelpgrelay.WithSystem("kafka"))
	bh, ok := h.(pgrelay.InboxBatchHandler)
	require.True(t, ok, "a batch handler stays one")
	evs := []*pgrelay.InboxEvent{
		{Message: pgrelay.Message{EventID: "a", Topic: "orders", TraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}, Handler: "billing"},
		{Message: pgrelay.Message{EventID: "b", Topic: "orders"}, Handler: "billing"},
		{Message: pgrelay.Message{EventID: "c", Topic: "orders", TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}, Handler: "billing"},
	}
	require.NoError(t, bh.HandleBatch(context.Background(), nil, evs))
	require.Len(t, inner.batches, 1)
	spans := exp.GetSpans()
	require.Len(t, spans, 1)
	s := spans[0]
	require.Equal(t, "process orders", s.Name)
	require.Equal(t, trace.SpanKindConsumer, s.SpanKind)
	require.Len(t, s.Links, 2, "one link per traced event")
	require.Equal(t, "0af7651916cd43dd8448eb211c80319c", s.Links[0].SpanContext.TraceID().String())
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", s.Links[1].SpanContext.TraceID().String())
	require.Contains(t, s.Attributes, semconv.MessagingBatchMessageCount(3))
	require.Contains(t, s.Attributes, semconv.MessagingConsumerGroupName("billing"))
	require.Contains(t, s.Attributes, semconv.MessagingSystemKafka)

	plain := otelpgrelay.NewHandler(pgrelay.HandlerFunc(func(context.Context, pgx.Tx, *pgrelay.InboxEvent) error {
		return pgrelay.Defer("order:1")
	}), otelpgrelay.WithTracerProvider(tp))
	_, isBatch := plain.(pgrelay.InboxBatchHandler)
	require.False(t, isBatch, "a plain handler does not become a batch handler")
	ext, ok := plain.(pgrelay.ExternalHandler)
	require.True(t, ok)
	require.False(t, ext.ExternalEffects())
	err := plain.Handle(context.Background(), nil, &pgrelay.InboxEvent{Message: pgrelay.Message{EventID: "d", Topic: "orders"}})
	require.Error(t, err)
	deferred := exp.GetSpans()[1]
	require.Equal(t, "Unset", deferred.Status.Code.String(), "a Defer is no failure")
	require.False(t, deferred.Parent.IsValid(), "an event without a trace context starts a trace")

	wrapped := otelpgrelay.NewHandler(externalHandler{}, otelpgrelay.WithTracerProvider(tp)).(pgrelay.ExternalHandler)
	require.True(t, wrapped.ExternalEffects(), "ExternalEffects is the wrapped handler's")

	failing := otelpgrelay.NewHandler(pgrelay.HandlerFunc(func(context.Context, pgx.Tx, *pgrelay.InboxEvent) error {
		return errors.New("boom")
	}), otelpgrelay.WithTracerProvider(tp))
	require.Error(t, failing.Handle(context.Background(), nil, &pgrelay.InboxEvent{Message: pgrelay.Message{EventID: "e", Topic: "orders"}}))
	require.Equal(t, "Error", exp.GetSpans()[2].Status.Code.String())
}

// TestContextWithProducer: the producer's context becomes the remote parent.
func TestContextWithProducer(t *testing.T) {
	m := pgrelay.Message{TraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	sc := trace.SpanContextFromContext(otelpgrelay.ContextWithProducer(context.Background(), m))
	require.True(t, sc.IsRemote())
	require.Equal(t, "b7ad6b7169203331", sc.SpanID().String())
	require.False(t, trace.SpanContextFromContext(otelpgrelay.ContextWithProducer(context.Background(), pgrelay.Message{TraceParent: "garbage"})).IsValid())
}
