package otelpgrelay_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/kafka"
	"github.com/pgrelay/pgrelay/broker/nats"
	"github.com/pgrelay/pgrelay/broker/postgres"
	"github.com/pgrelay/pgrelay/broker/rabbitmq"
	"github.com/pgrelay/pgrelay/consumer"
	"github.com/pgrelay/pgrelay/internal/testamqp"
	"github.com/pgrelay/pgrelay/internal/testcluster"
	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/internal/testnats"
	"github.com/pgrelay/pgrelay/otelpgrelay"
	"github.com/pgrelay/pgrelay/relay"
)

// env is one broker: the relay's publisher, the consumer's subscription and
// the broker's messaging.system value.
type env struct {
	system    string
	pub       broker.Publisher
	subscribe func(context.Context) (broker.Subscriber, error) // nil: a direct consumer (PostgreSQL as the broker)
}

func natsEnv(t *testing.T, ctx context.Context, _ *pgxpool.Pool) env {
	u := testnats.URL(t)
	stream, prefix := testnats.Stream(t, u)
	pub, err := nats.NewPublisher(ctx, nats.Config{URL: u, SubjectPrefix: prefix, Stream: stream})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	return env{system: "nats", pub: pub,
		subscribe: broker.Subscribe(nats.NewSubscriber, nats.Config{URL: u, Stream: stream, SubjectPrefix: prefix})}
}

func kafkaEnv(t *testing.T, ctx context.Context, _ *pgxpool.Pool) env {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "shop.orders"))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	pub, err := kafka.NewPublisher(ctx, kafka.Config{Brokers: c.ListenAddrs(), TopicPrefix: "shop"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	return env{system: "kafka", pub: pub,
		subscribe: broker.Subscribe(kafka.NewSubscriber, kafka.Config{Brokers: c.ListenAddrs(), TopicPrefix: "shop", Group: "billing"})}
}

func rabbitEnv(t *testing.T, ctx context.Context, _ *pgxpool.Pool) env {
	u := testamqp.URL(t)
	exchange, queue := testamqp.Names(t, u)
	cfg := rabbitmq.Config{URL: u, Exchange: exchange, Queue: queue}
	var pub *rabbitmq.Publisher
	require.NoError(t, testamqp.Retry(time.Minute, func() (err error) { pub, err = rabbitmq.NewPublisher(ctx, cfg); return err }))
	t.Cleanup(func() { _ = pub.Close() })
	subscribe := broker.Subscribe(rabbitmq.NewSubscriber, cfg)
	return env{system: "rabbitmq", pub: pub, subscribe: func(ctx context.Context) (sub broker.Subscriber, err error) {
		err = testamqp.Retry(time.Minute, func() error { sub, err = subscribe(ctx); return err })
		return sub, err
	}}
}

// postgresEnv: the relay stores into the inbox of the database it reads
// (broker/postgres), the consumer runs its workers only.
func postgresEnv(t *testing.T, ctx context.Context, pool *pgxpool.Pool) env {
	pub, err := postgres.NewPublisher(ctx, postgres.Config{URL: pool.Config().ConnString()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	return env{system: "postgresql", pub: pub}
}

// handled is one run of the handler: the span context its ctx held and the
// event as it saw it.
type handled struct {
	sc      trace.SpanContext
	ev      pgrelay.InboxEvent
	attempt int
}

// pipeline runs a relay publishing through e.pub and a consumer from
// e.subscribe, the publisher and the handler wrapped with tp's tracing (tp
// nil: not wrapped). The handler fails its first attempt of every event
// (the retry runs from the inbox row) and reports each run on the channel.
func pipeline(t *testing.T, ctx context.Context, pool *pgxpool.Pool, e env, opts ...any) <-chan handled {
	var tracing []otelpgrelay.Option
	var tweaks []func(*relay.Config)
	for _, o := range opts {
		switch o := o.(type) {
		case otelpgrelay.Option:
			tracing = append(tracing, o)
		case func(*relay.Config):
			tweaks = append(tweaks, o)
		}
	}
	runs := make(chan handled, 16)
	var attempts sync.Map
	var h pgrelay.InboxHandler = pgrelay.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
		n, _ := attempts.LoadOrStore(ev.EventID, new(atomic.Int32))
		a := int(n.(*atomic.Int32).Add(1))
		runs <- handled{sc: trace.SpanContextFromContext(ctx), ev: *ev, attempt: a}
		if a == 1 {
			return errors.New("first attempt fails")
		}
		return nil
	})
	pub := e.pub
	if tracing != nil {
		pub = otelpgrelay.NewPublisher(pub, tracing...)
		h = otelpgrelay.NewHandler(h, tracing...)
	}
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	rcfg := relay.Config{Pool: pool, Publisher: pub, PollInterval: 50 * time.Millisecond, Logger: log}
	for _, tweak := range tweaks {
		tweak(&rcfg)
	}
	r, err := relay.New(rcfg)
	require.NoError(t, err)
	ccfg := consumer.Config{Pool: pool, MaxWait: 50 * time.Millisecond, Logger: log, Subscribe: e.subscribe, Direct: e.subscribe == nil,
		Inbox: pgrelay.InboxConfig{Handler: h, BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond, PollInterval: 50 * time.Millisecond}}
	if ccfg.Direct { // broker/postgres stores into the inbox: the handler is registered
		ccfg.Register = postgres.RegisterTargets(pool, nil, pgrelay.Target{Handler: pgrelay.DefaultHandlerName})
	}
	c, err := consumer.New(ccfg)
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = r.Run(runCtx) })
	wg.Go(func() { _ = c.Run(runCtx) })
	t.Cleanup(func() { stop(); wg.Wait() })
	return runs
}

// nextRun waits for the handler's next run.
func nextRun(t *testing.T, runs <-chan handled) handled {
	t.Helper()
	select {
	case h := <-runs:
		return h
	case <-time.After(45 * time.Second):
		t.Fatal("the handler did not run")
		return handled{}
	}
}

// produce serves one HTTP request through otelhttp with tp; the handler
// enqueues an event with otelpgrelay.Enqueue in the request's transaction.
// It returns the request's server span context.
func produce(t *testing.T, ctx context.Context, pool *pgxpool.Pool, tp trace.TracerProvider, eventID string) trace.SpanContext {
	var server trace.SpanContext
	srv := httptest.NewServer(otelhttp.NewHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		server = trace.SpanContextFromContext(r.Context())
		err := pgx.BeginFunc(r.Context(), pool, func(tx pgx.Tx) error {
			return otelpgrelay.Enqueue(r.Context(), tx, pgrelay.Message{EventID: eventID, Topic: "orders", Key: "o-1",
				EventType: "OrderPlaced", Payload: []byte(`{"id":1}`), ContentType: "application/json"})
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusAccepted)
	}), "POST /orders", otelhttp.WithTracerProvider(tp)))
	defer srv.Close()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/orders", strings.NewReader(`{}`))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusAccepted, resp.StatusCode)
	require.True(t, server.IsValid())
	return server
}

// TestTraceFromRequestToHandler: for each broker, the HTTP request that
// enqueues, the relay's send span and the handler's process spans (the
// failed first attempt and the retry, run from the inbox row) share one
// trace id; the send span is the request's child and links to it, each
// process span is its child, and the handler's ctx is the process span's.
func TestTraceFromRequestToHandler(t *testing.T) {
	for name, newEnv := range map[string]func(*testing.T, context.Context, *pgxpool.Pool) env{
		"nats": natsEnv, "kafka": kafkaEnv, "rabbitmq": rabbitEnv, "postgres": postgresEnv,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			pool := testdb.New(t)
			exp := tracetest.NewInMemoryExporter()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
			e := newEnv(t, ctx, pool)
			runs := pipeline(t, ctx, pool, e, otelpgrelay.WithTracerProvider(tp), otelpgrelay.WithSystem(e.system))

			eventID := "ev-" + name
			server := produce(t, ctx, pool, tp, eventID)
			first, second := nextRun(t, runs), nextRun(t, runs)
			require.Equal(t, 2, second.attempt)

			// Every span is ended by the time the spans are read: the
			// process span of the second run ends after it returns.
			var spans tracetest.SpanStubs
			require.Eventually(t, func() bool {
				spans = exp.GetSpans()
				return len(byKind(spans, trace.SpanKindConsumer)) == 2 && len(byKind(spans, trace.SpanKindProducer)) >= 1
			}, 30*time.Second, 10*time.Millisecond)

			require.Len(t, byKind(spans, trace.SpanKindServer), 1)
			producer := byKind(spans, trace.SpanKindServer)[0]
			require.Equal(t, server, producer.SpanContext)
			for _, send := range byKind(spans, trace.SpanKindProducer) {
				require.Equal(t, server.TraceID(), send.SpanContext.TraceID(), "send span in the producer's trace")
				require.Equal(t, server.SpanID(), send.Parent.SpanID(), "send span is the request's child")
				require.Len(t, send.Links, 1)
				require.Equal(t, server.SpanID(), send.Links[0].SpanContext.SpanID(), "send span links to the producer")
				require.Equal(t, "send orders", send.Name)
				requireAttrs(t, send.Attributes, e.system, "send", eventID)
			}
			runOf := map[trace.SpanID]handled{first.sc.SpanID(): first, second.sc.SpanID(): second}
			for _, proc := range byKind(spans, trace.SpanKindConsumer) {
				require.Equal(t, server.TraceID(), proc.SpanContext.TraceID(), "process span in the producer's trace")
				require.Equal(t, server.SpanID(), proc.Parent.SpanID(), "process span is the request's child")
				require.True(t, proc.Parent.IsRemote())
				require.Equal(t, "process orders", proc.Name)
				requireAttrs(t, proc.Attributes, e.system, "process", eventID)
				run, ok := runOf[proc.SpanContext.SpanID()]
				require.True(t, ok, "the handler runs in the process span")
				require.Contains(t, proc.Attributes, attribute.Int("pgrelay.attempt", run.ev.Attempts))
				if run.attempt == 1 {
					require.Equal(t, "Error", proc.Status.Code.String(), "the failed attempt's span says so")
				} else {
					require.Equal(t, "Unset", proc.Status.Code.String())
				}
			}
			require.Equal(t, server.TraceID().String(), second.ev.TraceParent[3:35], "the handler sees the trace context")
		})
	}
}

// TestTraceThroughWALCapture: an event emitted to the write-ahead log
// (otelpgrelay.Emit) under the producer's span reaches the handler's process
// span in the same trace, through a relay capturing from the WAL.
func TestTraceThroughWALCapture(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, "wal_level = logical\nmax_slot_wal_keep_size = '64MB'\nmax_replication_slots = 10\nmax_wal_senders = 10")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, c.URL())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	e := natsEnv(t, ctx, pool)
	runs := pipeline(t, ctx, pool, e, func(cfg *relay.Config) { cfg.Capture = "wal" },
		otelpgrelay.WithTracerProvider(tp), otelpgrelay.WithSystem(e.system))

	// Events emitted before the relay made its slot are not captured.
	require.Eventually(t, func() bool {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE active`).Scan(&n)
		return n > 0
	}, time.Minute, 20*time.Millisecond)
	ctx2, span := tp.Tracer("producer").Start(ctx, "request")
	require.NoError(t, pgx.BeginFunc(ctx2, pool, func(tx pgx.Tx) error {
		return otelpgrelay.Emit(ctx2, tx, pgrelay.Message{EventID: "wal-1", Topic: "orders", EventType: "OrderPlaced", Payload: []byte(`{}`)})
	}))
	span.End()
	for range 2 {
		run := nextRun(t, runs)
		require.Equal(t, span.SpanContext().TraceID(), run.sc.TraceID(), "the handler runs in the producer's trace")
	}
}

func byKind(spans tracetest.SpanStubs, kind trace.SpanKind) tracetest.SpanStubs {
	var out tracetest.SpanStubs
	for _, s := range spans {
		if s.SpanKind == kind {
			out = append(out, s)
		}
	}
	return out
}

func requireAttrs(t *testing.T, attrs []attribute.KeyValue, system, op, eventID string) {
	t.Helper()
	require.Contains(t, attrs, semconv.MessagingSystemKey.String(system))
	require.Contains(t, attrs, semconv.MessagingDestinationName("orders"))
	require.Contains(t, attrs, semconv.MessagingMessageID(eventID))
	require.Contains(t, attrs, semconv.MessagingOperationTypeKey.String(op))
	require.Contains(t, attrs, semconv.MessagingOperationName(op))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
