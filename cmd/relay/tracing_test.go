package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

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

func (o *otlpReceiver) all() []byte {
	o.mu.Lock()
	defer o.mu.Unlock()
	return bytes.Join(o.bodies, nil)
}

// TestRunExportsSendSpans: with OTEL_EXPORTER_OTLP_ENDPOINT set, `relay run`
// publishes a row's trace context as the traceparent and tracestate headers
// and exports its send span, in the row's trace and under OTEL_SERVICE_NAME,
// over OTLP/HTTP by the time it exits.
func TestRunExportsSendSpans(t *testing.T) {
	recv := &otlpReceiver{}
	srv := httptest.NewServer(recv)
	defer srv.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv("OTEL_SERVICE_NAME", "relay-under-test")
	pool := testdb.New(t)
	url := pool.Config().ConnString()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "shop.orders"))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- execute(ctx, "run", "--database-url", url, "--broker", "kafka", "--kafka-brokers", c.ListenAddrs()[0],
			"--kafka-topic-prefix", "shop", "--lease", "2s", "--poll-interval", "100ms", "--log-level", "warn",
			"--metrics-addr", "127.0.0.1:0", "--admin-addr", "")
	}()
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	const traceparent = "00-" + traceID + "-00f067aa0ba902b7-01"
	_, err = pool.Exec(context.Background(), `INSERT INTO pgrelay.outbox (event_id, topic, key, payload, traceparent, tracestate)
		VALUES ('evt-t1', 'orders', 'order-7', 'x', $1, 'rojo=00f067aa0ba902b7')`, traceparent)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var n int
		_ = pool.QueryRow(context.Background(), `SELECT count(*) FROM pgrelay.outbox WHERE status = 'published'`).Scan(&n)
		return n == 1
	}, 20*time.Second, 20*time.Millisecond)
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("relay did not stop")
	}
	exported := recv.all()
	id, _ := hex.DecodeString(traceID)
	require.True(t, bytes.Contains(exported, id), "a span of the row's trace was exported")
	require.Contains(t, string(exported), "send orders")
	require.Contains(t, string(exported), "relay-under-test")
	require.Contains(t, string(exported), "messaging.system")

	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("shop.orders"))
	require.NoError(t, err)
	defer cl.Close()
	fctx, fcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer fcancel()
	fs := cl.PollRecords(fctx, 10)
	require.NoError(t, fs.Err())
	recs := fs.Records()
	require.Len(t, recs, 1)
	h := map[string]string{}
	for _, rh := range recs[0].Headers {
		h[rh.Key] = string(rh.Value)
	}
	require.Equal(t, traceparent, h["traceparent"])
	require.Equal(t, "rojo=00f067aa0ba902b7", h["tracestate"])
}

// TestTracingSettingsNameTheVariable: an OTEL_* value the relay cannot use
// fails at start-up, naming the variable.
func TestTracingSettingsNameTheVariable(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "jaeger")
	require.ErrorContains(t, execute(context.Background(), "run", "--database-url", "postgres://x"), "OTEL_TRACES_EXPORTER")
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon")
	require.ErrorContains(t, execute(context.Background(), "run", "--database-url", "postgres://x"), "OTEL_EXPORTER_OTLP_PROTOCOL")
}
