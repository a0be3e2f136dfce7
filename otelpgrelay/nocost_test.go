package otelpgrelay_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/otelpgrelay"
)

// TestNoProviderCostsOnlyTheHeader: with the relay and the consumer
// instrumented through the no-op provider (what OpenTelemetry's global
// default is), the producer's trace context still travels to the handler
// (whose ctx carries it, so what it enqueues stays in the trace) and nothing
// else is recorded: the producer's span is the only one. An event enqueued
// without a span carries no trace context at all (NULL columns).
func TestNoProviderCostsOnlyTheHeader(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool := testdb.New(t)
	exp := tracetest.NewInMemoryExporter()
	producerTP := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	e := natsEnv(t, ctx, pool)
	runs := pipeline(t, ctx, pool, e, otelpgrelay.WithTracerProvider(noop.NewTracerProvider()), otelpgrelay.WithSystem(e.system))

	server := produce(t, ctx, pool, producerTP, "traced")
	for _, want := range []int{1, 2} {
		run := nextRun(t, runs)
		require.Equal(t, want, run.attempt)
		require.Equal(t, server.TraceID(), run.sc.TraceID(), "the handler's ctx carries the producer's context")
		require.Equal(t, server.SpanID(), run.sc.SpanID(), "no span of its own")
		require.False(t, trace.SpanFromContext(context.Background()).IsRecording())
	}
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return otelpgrelay.Enqueue(ctx, tx, pgrelay.Message{EventID: "untraced", Topic: "orders", EventType: "OrderPlaced"})
	}))
	for range 2 {
		run := nextRun(t, runs)
		require.Equal(t, "untraced", run.ev.EventID)
		require.False(t, run.sc.IsValid())
		require.Empty(t, run.ev.TraceParent)
		require.Empty(t, run.ev.TraceState)
	}
	var parents, nulls int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(traceparent), count(*) FILTER (WHERE traceparent IS NULL AND tracestate IS NULL) FROM pgrelay.outbox`).Scan(&parents, &nulls))
	require.Equal(t, 1, parents)
	require.Equal(t, 1, nulls, "no trace context: NULL columns")
	require.Len(t, exp.GetSpans(), 1, "only the producer's span was recorded")
}

// TestInjectWithoutSpanAllocatesNothing: without a span context in ctx,
// Inject returns the messages as they are, at no cost.
func TestInjectWithoutSpanAllocatesNothing(t *testing.T) {
	msgs := []pgrelay.Message{{Topic: "orders"}}
	ctx := context.Background()
	_, span := noop.NewTracerProvider().Tracer("t").Start(ctx, "noop")
	ctx = trace.ContextWithSpan(ctx, span)
	allocs := testing.AllocsPerRun(100, func() {
		out := otelpgrelay.Inject(ctx, msgs...)
		if &out[0] != &msgs[0] {
			t.Fatal("copied")
		}
	})
	require.Zero(t, allocs)
}

// TestInjectKeepsAnExplicitTraceContext: Inject fills the trace context from
// the span in ctx, W3C-formatted with its trace state, and leaves a message
// that has its own alone.
func TestInjectKeepsAnExplicitTraceContext(t *testing.T) {
	tp := sdktrace.NewTracerProvider()
	ts, err := trace.ParseTraceState("vendor=abc")
	require.NoError(t, err)
	parent := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled, TraceState: ts, Remote: true})
	ctx, span := tp.Tracer("t").Start(trace.ContextWithRemoteSpanContext(context.Background(), parent), "request")
	defer span.End()
	own := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	out := otelpgrelay.Inject(ctx, pgrelay.Message{Topic: "a"}, pgrelay.Message{Topic: "b", TraceParent: own})
	require.Equal(t, "00-"+span.SpanContext().TraceID().String()+"-"+span.SpanContext().SpanID().String()+"-01", out[0].TraceParent)
	require.Equal(t, "vendor=abc", out[0].TraceState)
	require.Equal(t, own, out[1].TraceParent)
	require.Empty(t, out[1].TraceState)
	sc := otelpgrelay.SpanContext(out[0])
	require.True(t, sc.IsRemote())
	require.Equal(t, span.SpanContext().SpanID(), sc.SpanID())
}

// TestEnqueueRefusesAnUnstorableTraceContext: Enqueue holds the trace
// context to what the outbox's outbox_trace_context_length constraint and
// the broker headers take.
func TestEnqueueRefusesAnUnstorableTraceContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := testdb.New(t)
	long := make([]byte, pgrelay.MaxTraceParentLen+1)
	for i := range long {
		long[i] = 'a'
	}
	for _, m := range []pgrelay.Message{
		{Topic: "orders", TraceParent: string(long)},
		{Topic: "orders", TraceParent: "00-x", TraceState: string(make([]byte, pgrelay.MaxTraceStateLen+1))},
		{Topic: "orders", TraceParent: "00-x\n"},
	} {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return pgrelay.Enqueue(ctx, tx, m) })
		require.ErrorContains(t, err, "message 0: trace context")
	}
}
