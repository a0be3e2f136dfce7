package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/internal/testnats"
)

// TestWireSettingsNameTheSetting: a bad --wire-format or --ce-source (flag
// or environment) fails at start-up naming the setting; valid ones pass the
// check for every broker.
func TestWireSettingsNameTheSetting(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	ctx := context.Background()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--wire-format", "json"}, `--wire-format (RELAY_WIRE_FORMAT): "json" is not a wire format: want pgrelay or cloudevents`},
		{[]string{"--wire-format", "cloudevents", "--ce-source", "has space"}, "--ce-source (RELAY_CE_SOURCE)"},
		{[]string{"--wire-format", "cloudevents", "--ce-source", ""}, "--ce-source (RELAY_CE_SOURCE): must not be empty"},
		{[]string{"--broker", "kafka", "--kafka-brokers", "127.0.0.1:1", "--wire-format", "CloudEvents"}, "--wire-format (RELAY_WIRE_FORMAT)"},
	} {
		args := append([]string{"run", "--database-url", "postgres://x"}, c.args...)
		require.ErrorContains(t, execute(ctx, args...), c.want, "%v", c.args)
	}
	t.Setenv("RELAY_WIRE_FORMAT", "xml")
	require.ErrorContains(t, execute(ctx, "run", "--database-url", "postgres://x"), "--wire-format (RELAY_WIRE_FORMAT)")
	t.Setenv("RELAY_WIRE_FORMAT", "cloudevents")
	t.Setenv("RELAY_CE_SOURCE", "caf\u00e9")
	require.ErrorContains(t, execute(ctx, "run", "--database-url", "postgres://x"), "--ce-source (RELAY_CE_SOURCE)")
	t.Setenv("RELAY_CE_SOURCE", "/billing")
	for _, b := range [][]string{{"--broker", "nats"}, {"--broker", "kafka", "--kafka-brokers", "127.0.0.1:1"},
		{"--broker", "rabbitmq", "--amqp-url", "amqp://127.0.0.1:1/"}} {
		err := execute(ctx, append([]string{"run", "--database-url", "::not a url::"}, b...)...)
		require.ErrorContains(t, err, "--database-url (DATABASE_URL)", "%v: the wire settings pass, the next check fails", b)
	}
}

// TestRunCloudEvents: `relay run --wire-format cloudevents --ce-source`
// publishes CloudEvents binary mode: the flags reach the publisher.
func TestRunCloudEvents(t *testing.T) {
	pool := testdb.New(t)
	natsURL := testnats.URL(t)
	stream, prefix := testnats.Stream(t, natsURL)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- execute(ctx, "run", "--database-url", pool.Config().ConnString(), "--nats-url", natsURL, "--stream", stream,
			"--subject-prefix", prefix, "--wire-format", "cloudevents", "--ce-source", "/shop", "--lease", "2s",
			"--poll-interval", "100ms", "--log-level", "warn", "--metrics-addr", "127.0.0.1:0", "--admin-addr", "")
	}()
	_, err := pool.Exec(ctx, `INSERT INTO pgrelay.outbox (event_id, topic, key, event_type, payload) VALUES ('ce-1', 'orders', 'k', 'OrderCreated', '{}')`)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM pgrelay.outbox WHERE status = 'published'`).Scan(&n)
		return n == 1
	}, 20*time.Second, 20*time.Millisecond)
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("relay did not stop")
	}
	_, js := testnats.Connect(t, natsURL)
	rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer rcancel()
	s, err := js.Stream(rctx, stream)
	require.NoError(t, err)
	m, err := s.GetMsg(rctx, 1)
	require.NoError(t, err)
	require.Equal(t, "1.0", m.Header.Get("ce-specversion"))
	require.Equal(t, "ce-1", m.Header.Get("ce-id"))
	require.Equal(t, "/shop", m.Header.Get("ce-source"))
	require.Equal(t, "OrderCreated", m.Header.Get("ce-type"))
	require.Equal(t, "k", m.Header.Get("ce-partitionkey"))
}
