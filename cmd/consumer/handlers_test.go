package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	pgnats "github.com/pgrelay/pgrelay/broker/nats"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/internal/testnats"
)

// runWithHandler runs `consumer run` with the handler flags on a fresh stream
// until the test ends, publishes events (each twice, under new broker ids)
// and waits until the inbox processed them all.
func runWithHandler(t *testing.T, dbURL string, handlerArgs []string, events int) {
	t.Helper()
	natsURL := testnats.URL(t)
	stream, prefix := testnats.Stream(t, natsURL)
	startConsumerCommand(t, append([]string{"run", "--database-url", dbURL, "--nats-url", natsURL, "--stream", stream,
		"--subject-prefix", prefix, "--durable", "handler-test", "--metrics-addr", "", "--admin-addr", "",
		"--log-level", "error", "--max-wait", "100ms"}, handlerArgs...)...)
	_, js := testnats.Connect(t, natsURL)
	for round := range 2 {
		for i := range events {
			m := nats.NewMsg(prefix + ".orders")
			m.Header.Set(pgnats.MsgIDHeader, fmt.Sprintf("m-%d-%d", i, round))
			m.Header.Set(event.HeaderEventID, fmt.Sprintf("e-%d", i))
			m.Header.Set(event.HeaderEventType, "OrderCreated")
			m.Header.Set(event.HeaderKey, fmt.Sprintf("o-%d", i))
			m.Data = []byte(fmt.Sprintf(`{"order_id":"o-%d"}`, i))
			pctx, pcancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := js.PublishMsg(pctx, m)
			pcancel()
			require.NoError(t, err)
		}
	}
	pool, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	defer pool.Close()
	require.Eventually(t, func() bool {
		var n int
		_ = pool.QueryRow(context.Background(), `SELECT count(*) FROM pgrelay.inbox WHERE status = 'processed'`).Scan(&n)
		return n == events
	}, time.Minute, 50*time.Millisecond, "the consumer never processed the %d events", events)
}

// TestRunHandlerSQL runs `consumer run --handler sql` end to end: JetStream
// into the inbox, then the team's PL/pgSQL function applying each event once.
func TestRunHandlerSQL(t *testing.T) {
	dbURL := testdb.NewURL(t)
	pool, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	defer pool.Close()
	_, err = pool.Exec(context.Background(), `CREATE SCHEMA app;
		CREATE TABLE app.orders (order_id text PRIMARY KEY, times int NOT NULL);
		CREATE FUNCTION app.handle_event(event_id text, topic text, key text, event_type text,
		                                 payload bytea, headers jsonb, attempt int) RETURNS void
		LANGUAGE plpgsql AS $$
		BEGIN
		    INSERT INTO app.orders VALUES (convert_from(payload, 'UTF8')::jsonb->>'order_id', 1)
		    ON CONFLICT (order_id) DO UPDATE SET times = app.orders.times + 1;
		END $$`)
	require.NoError(t, err)

	err = run(t, "run", "--database-url", dbURL, "--nats-url", testnats.URL(t), "--handler", "sql",
		"--sql-function", "app.missing", "--metrics-addr", "", "--admin-addr", "")
	require.ErrorContains(t, err, "--sql-function (CONSUMER_SQL_FUNCTION): no function app.missing(text, text, text, text, bytea, jsonb, integer)")

	runWithHandler(t, dbURL, []string{"--handler", "sql", "--sql-function", "app.handle_event"}, 5)
	var rows, maxTimes int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*), max(times) FROM app.orders`).Scan(&rows, &maxTimes))
	require.Equal(t, 5, rows)
	require.Equal(t, 1, maxTimes, "each event applied once")
}

// TestRunHandlerHTTP runs `consumer run --handler http` end to end against a
// real webhook that fails each event's first request.
func TestRunHandlerHTTP(t *testing.T) {
	dbURL := testdb.NewURL(t)
	var mu sync.Mutex
	requests, applied := map[string]int{}, map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		defer mu.Unlock()
		requests[key]++
		if requests[key] == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		applied[key]++
	}))
	defer srv.Close()

	require.ErrorContains(t, run(t, "run", "--database-url", dbURL, "--handler", "http"), "--url (CONSUMER_HTTP_URL) is required with --handler http")
	require.ErrorContains(t, run(t, "run", "--database-url", dbURL, "--handler", "smtp"), `--handler (CONSUMER_HANDLER) "smtp": want ledger, sql or http`)
	require.ErrorContains(t, run(t, "run", "--database-url", dbURL, "--url", srv.URL), "--url (CONSUMER_HTTP_URL) is set but --handler (CONSUMER_HANDLER) is ledger: add --handler http")
	require.ErrorContains(t, run(t, "run", "--database-url", dbURL, "--handler", "http", "--url", "ftp://x"), "--url (CONSUMER_HTTP_URL) \"ftp://x\" must be an absolute http or https URL")
	require.ErrorContains(t, run(t, "run", "--database-url", dbURL, "--handler", "http", "--url", srv.URL, "--http-timeout", "1m"), "--http-timeout (CONSUMER_HTTP_TIMEOUT) 1m0s must be positive and shorter than --handler-timeout (CONSUMER_HANDLER_TIMEOUT) 10s")

	runWithHandler(t, dbURL, []string{"--handler", "http", "--url", srv.URL, "--http-timeout", "2s"}, 5)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, applied, 5)
	for key, n := range applied {
		// Each event commits on its own and none is applied on receive, so
		// another event's 503 never repeats a success.
		require.Equal(t, 1, n, "%s applied", key)
		require.Equal(t, 2, requests[key], "%s: the 503 was retried, once", key)
	}
	pool, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	defer pool.Close()
	var withStatus int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM pgrelay.inbox WHERE handler_status = 200 AND handler_latency_ms >= 0`).Scan(&withStatus))
	require.Equal(t, 5, withStatus, "the response is recorded on each inbox row")
}

// TestRunDirectRegistersItsHandler: `consumer run --broker postgres` records
// its handler, key strategy and --pg-topics for the relay that stores into
// its inbox (consumer.Config.Register), then runs the workers.
func TestRunDirectRegistersItsHandler(t *testing.T) {
	dbURL := testdb.NewURL(t)
	pool, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	startConsumerCommand(t, "run", "--database-url", dbURL, "--broker", "postgres", "--pg-topics", "orders",
		"--handler", "http", "--url", "http://127.0.0.1:1/hook", "--handler-name", "direct-h",
		"--dedup-key", "business:payment:{order_id}", "--metrics-addr", "", "--admin-addr", "")
	require.Eventually(t, func() bool {
		var key string
		var topics []string
		err := pool.QueryRow(context.Background(), `SELECT dedup_key, topics FROM pgrelay.inbox_subscriptions WHERE handler = 'direct-h'`).Scan(&key, &topics)
		return err == nil && key == "business:payment:{order_id}" && len(topics) == 1 && topics[0] == "orders"
	}, 20*time.Second, 50*time.Millisecond)
}
