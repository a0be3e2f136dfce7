package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker/kafka"
	"github.com/pgrelay/pgrelay/internal/ledger"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// otlpReceiver collects the bodies of OTLP/HTTP trace exports.
type otlpReceiver struct {
	mu     sync.Mutex
	bodies [][]byte
}

func (o *otlpReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	if r.URL.Path == "/v1/traces" {
		o.mu.Lock()
		o.bodies = append(o.bodies, b)
		o.mu.Unlock()
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.WriteHeader(http.StatusOK)
}

// TestRunExportsProcessSpans: with OTEL_EXPORTER_OTLP_ENDPOINT set,
// `consumer run` runs the handler under a process span in the trace of the
// delivery's traceparent header and exports it over OTLP/HTTP, under
// OTEL_SERVICE_NAME, by the time it exits.
func TestRunExportsProcessSpans(t *testing.T) {
	recv := &otlpReceiver{}
	srv := httptest.NewServer(recv)
	defer srv.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv("OTEL_SERVICE_NAME", "consumer-under-test")
	dbURL := testdb.NewURL(t)
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "shop.orders"))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	brokers := c.ListenAddrs()[0]
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		cmd := newRootCommand()
		cmd.SetArgs([]string{"run", "--database-url", dbURL, "--broker", "kafka", "--kafka-brokers", brokers,
			"--kafka-topic-prefix", "shop", "--kafka-group", "ledger", "--metrics-addr", "", "--admin-addr", "",
			"--log-level", "error", "--max-wait", "100ms"})
		cmd.SetOut(io.Discard)
		cmd.SetErr(io.Discard)
		done <- cmd.ExecuteContext(runCtx)
	}()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pub, err := kafka.NewPublisher(ctx, kafka.Config{Brokers: []string{brokers}, TopicPrefix: "shop"})
	require.NoError(t, err)
	defer pub.Close()
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	payload, _ := json.Marshal(ledger.OrderCreated{OrderID: "o-1", CustomerID: "c", AmountCents: 100, Currency: "EUR"})
	for _, r := range pub.Publish(ctx, []pgrelay.Message{{EventID: "created-o-1", Topic: "orders", Key: "o-1",
		EventType: ledger.EventOrderCreated, Payload: payload, ContentType: "application/json",
		TraceParent: "00-" + traceID + "-00f067aa0ba902b7-01"}}) {
		require.NoError(t, r.Err)
	}
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	defer pool.Close()
	require.Eventually(t, func() bool {
		var processed int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM pgrelay.inbox WHERE status = 'processed'`).Scan(&processed)
		return processed == 1
	}, time.Minute, 50*time.Millisecond, "the consumer never processed the event")
	stop()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the consumer did not stop")
	}
	recv.mu.Lock()
	exported := bytes.Join(recv.bodies, nil)
	recv.mu.Unlock()
	id, _ := hex.DecodeString(traceID)
	require.True(t, bytes.Contains(exported, id), "a span of the delivery's trace was exported")
	require.Contains(t, string(exported), "process orders")
	require.Contains(t, string(exported), "consumer-under-test")
}

// TestTracingSettingsNameTheVariable: an OTEL_* value the consumer cannot
// use fails at start-up, naming the variable.
func TestTracingSettingsNameTheVariable(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "jaeger")
	require.ErrorContains(t, run(t, "run", "--database-url", "postgres://127.0.0.1:1/none"), "OTEL_TRACES_EXPORTER")
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")
	require.ErrorContains(t, run(t, "run", "--database-url", "postgres://127.0.0.1:1/none"), "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
}
