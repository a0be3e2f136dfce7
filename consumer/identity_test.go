package consumer_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	pgnats "github.com/pgrelay/pgrelay/broker/nats"
	"github.com/pgrelay/pgrelay/consumer"
	"github.com/pgrelay/pgrelay/internal/admin"
	"github.com/pgrelay/pgrelay/internal/admin/admincli"
	"github.com/pgrelay/pgrelay/internal/pgurl"
	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/internal/testnats"
)

// identityEnv is one database and one stream, with a charges table the
// scenario handlers write their side effect into (deliberately without a
// unique key: only the inbox stands between a duplicate and a second
// charge).
type identityEnv struct {
	pool           *pgxpool.Pool
	url            string
	natsURL        string
	stream, prefix string
	js             jetstream.JetStream
}

func newIdentityEnv(t *testing.T) *identityEnv {
	t.Helper()
	url := testdb.NewURL(t)
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	e := &identityEnv{pool: pool, url: url, natsURL: testnats.URL(t)}
	e.stream, e.prefix = testnats.Stream(t, e.natsURL)
	_, e.js = testnats.Connect(t, e.natsURL)
	_, err = pool.Exec(context.Background(), `CREATE TABLE charges (
		id bigint GENERATED ALWAYS AS IDENTITY, handler text NOT NULL, event_id text NOT NULL, payload jsonb NOT NULL)`)
	require.NoError(t, err)
	return e
}

// publish sends one message straight into the stream, under its own broker
// id (so JetStream never drops it as a duplicate).
func (e *identityEnv) publish(t *testing.T, eventID, eventType, payload string, headers map[string]string) {
	t.Helper()
	m := nats.NewMsg(e.prefix + ".payments")
	m.Header.Set("Pgrelay-Event-Id", eventID)
	m.Header.Set("Pgrelay-Event-Type", eventType)
	m.Header.Set("Nats-Msg-Id", fmt.Sprintf("%s-%d", eventID, time.Now().UnixNano()))
	for k, v := range headers {
		m.Header.Set(k, v)
	}
	m.Data = []byte(payload)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := e.js.PublishMsg(ctx, m)
	require.NoError(t, err)
}

// charge is the scenario handler: one charges row per processed event.
func charge(name string) pgrelay.InboxHandler {
	return pgrelay.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
		_, err := tx.Exec(ctx, `INSERT INTO charges (handler, event_id, payload) VALUES ($1, $2, $3)`,
			name, ev.EventID, string(ev.Payload))
		return err
	})
}

// run starts a consumer for one handler until the test ends.
func (e *identityEnv) run(t *testing.T, cfg consumer.Config) {
	t.Helper()
	cfg.Pool = e.pool
	// Each handler has a durable consumer of its own, so that each receives
	// every message.
	cfg.Subscribe = broker.Subscribe(pgnats.NewSubscriber, pgnats.Config{URL: e.natsURL, Stream: e.stream,
		SubjectPrefix: e.prefix, Durable: pgnats.DefaultDurable + "-" + cfg.Inbox.HandlerName})
	if cfg.Inbox.Handler == nil {
		cfg.Inbox.Handler = charge(cfg.Inbox.HandlerName)
	}
	cfg.MaxWait, cfg.Inbox.PollInterval = 50*time.Millisecond, 50*time.Millisecond
	cfg.Logger = testLogger(t)
	c, err := consumer.New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}

func (e *identityEnv) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, e.pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// settle waits until the durable has delivered and had acknowledged every
// message of the stream, and no inbox row is pending or processing.
func (e *identityEnv) settle(t *testing.T, durables ...string) {
	t.Helper()
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, d := range durables {
			c, err := e.js.Consumer(ctx, e.stream, d)
			if err != nil {
				return false
			}
			info, err := c.Info(ctx)
			if err != nil || info.NumPending > 0 || info.NumAckPending > 0 {
				return false
			}
		}
		return e.count(t, `SELECT count(*) FROM pgrelay.inbox WHERE status IN ('pending', 'processing')`) == 0
	}, 60*time.Second, 20*time.Millisecond, "never settled")
}

func (e *identityEnv) charges(t *testing.T, handler string) int {
	t.Helper()
	return e.count(t, `SELECT count(*) FROM charges WHERE handler = $1`, handler)
}

// TestScenarioDoubleClickedPayment: a payment button clicked twice sends two
// events (two event ids) for one order. Keyed by business key the order is
// charged once; keyed by message id it is charged twice: the difference the
// strategy makes. A payment lacking the key's field goes dead with the
// reason for the business-key handler only.
func TestScenarioDoubleClickedPayment(t *testing.T) {
	t.Parallel()
	e := newIdentityEnv(t)
	e.run(t, consumer.Config{Inbox: pgrelay.InboxConfig{HandlerName: "pay-by-order"}, DedupKey: "business:payment:{order_id}"})
	e.run(t, consumer.Config{Inbox: pgrelay.InboxConfig{HandlerName: "pay-by-id"}})
	e.publish(t, "click-1", "PaymentRequested", `{"order_id":"o-42","amount_cents":1250}`, nil)
	e.publish(t, "click-2", "PaymentRequested", `{"order_id":"o-42","amount_cents":1250}`, nil)
	e.publish(t, "no-order", "PaymentRequested", `{"amount_cents":1}`, nil)
	e.settle(t, "pgrelay-consumer-pay-by-order", "pgrelay-consumer-pay-by-id")

	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM charges WHERE handler = 'pay-by-order' AND payload->>'order_id' = 'o-42'`),
		"business key: one charge for the double click")
	require.Equal(t, 2, e.count(t, `SELECT count(*) FROM charges WHERE handler = 'pay-by-id' AND payload->>'order_id' = 'o-42'`),
		"message id: the double click charges twice")
	var reason string
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT last_error FROM pgrelay.inbox
		WHERE handler = 'pay-by-order' AND event_id = 'no-order' AND status = 'dead'`).Scan(&reason))
	require.Equal(t, "dedup key (business:payment:{order_id}): payload lacks field order_id", reason)
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM charges WHERE handler = 'pay-by-id' AND event_id = 'no-order'`))
	require.Zero(t, e.count(t, `SELECT count(*) FROM pgrelay.inbox_conflicts`))
}

// TestScenarioRetryStorm: one event delivered ten times at once, to two
// consumer instances of the same handler sharing its durable, is charged
// once and stored once, without a conflict.
func TestScenarioRetryStorm(t *testing.T) {
	t.Parallel()
	e := newIdentityEnv(t)
	for range 2 {
		e.run(t, consumer.Config{Inbox: pgrelay.InboxConfig{HandlerName: "ledger"}, FetchBatchSize: 1})
	}
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() { e.publish(t, "storm-1", "PaymentRequested", `{"order_id":"o-1","amount_cents":100}`, nil) })
	}
	wg.Wait()
	e.settle(t, "pgrelay-consumer-ledger")
	require.Equal(t, 1, e.charges(t, "ledger"))
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM pgrelay.inbox`))
	require.Zero(t, e.count(t, `SELECT count(*) FROM pgrelay.inbox_conflicts`))
}

// TestScenarioWebhookDeliveredThreeTimes: a webhook provider delivers one
// notification three times, each with a new event id but the same content;
// keyed by content hash it is applied once.
func TestScenarioWebhookDeliveredThreeTimes(t *testing.T) {
	t.Parallel()
	e := newIdentityEnv(t)
	e.run(t, consumer.Config{Inbox: pgrelay.InboxConfig{HandlerName: "webhook"}, DedupKey: "content-hash"})
	for i := range 3 {
		e.publish(t, fmt.Sprintf("hook-%d", i), "ChargeSucceeded", `{"charge":"ch_1","amount":990,"currency":"usd"}`, nil)
	}
	e.publish(t, "hook-other", "ChargeSucceeded", `{"charge":"ch_2","amount":990,"currency":"usd"}`, nil)
	e.settle(t, "pgrelay-consumer-webhook")
	require.Equal(t, 2, e.charges(t, "webhook"), "ch_1 once, ch_2 once")
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM charges WHERE payload->>'charge' = 'ch_1'`))
	require.Zero(t, e.count(t, `SELECT count(*) FROM pgrelay.inbox_conflicts`))
}

// TestScenarioOverlappingScheduledRuns: two overlapping runs of a nightly job
// each emit "report for 2026-11-23" under their own event id and run id.
// Keyed by the date (business key) or by a content hash of the date within a
// day (hybrid), the report is produced once; the second run's differing
// payload is surfaced as a conflict of the business-key handler.
func TestScenarioOverlappingScheduledRuns(t *testing.T) {
	t.Parallel()
	e := newIdentityEnv(t)
	e.run(t, consumer.Config{Inbox: pgrelay.InboxConfig{HandlerName: "report-by-date"}, DedupKey: "business:report:{date}"})
	e.run(t, consumer.Config{Inbox: pgrelay.InboxConfig{HandlerName: "report-hybrid"}, DedupKey: "hybrid:content-hash:date@24h"})
	at := map[string]string{"Pgrelay-Occurred-At": "2026-11-23T02:00:00.5Z"}
	e.publish(t, "run-a", "ReportRequested", `{"date":"2026-11-23","run_id":"a"}`, at)
	at2 := map[string]string{"Pgrelay-Occurred-At": "2026-11-23T02:00:03Z"}
	e.publish(t, "run-b", "ReportRequested", `{"date":"2026-11-23","run_id":"b"}`, at2)
	e.publish(t, "run-c", "ReportRequested", `{"date":"2026-11-24","run_id":"c"}`, map[string]string{"Pgrelay-Occurred-At": "2026-11-24T02:00:00Z"})
	e.settle(t, "pgrelay-consumer-report-by-date", "pgrelay-consumer-report-hybrid")
	for _, h := range []string{"report-by-date", "report-hybrid"} {
		require.Equal(t, 1, e.count(t, `SELECT count(*) FROM charges WHERE handler = $1 AND payload->>'date' = '2026-11-23'`, h), h)
		require.Equal(t, 1, e.count(t, `SELECT count(*) FROM charges WHERE handler = $1 AND payload->>'date' = '2026-11-24'`, h), h)
	}
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM pgrelay.inbox_conflicts WHERE handler = 'report-by-date' AND dedup_key = 'report:2026-11-23'`))
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM pgrelay.inbox_conflicts WHERE handler = 'report-hybrid'`))
}

// TestScenarioTwoHandlersOneEvent: one consumer stores every message for two
// handlers (the ledger, run by its workers, and a mailer, run by a worker of
// its own); each applies the event once, even when it is delivered twice.
func TestScenarioTwoHandlersOneEvent(t *testing.T) {
	t.Parallel()
	e := newIdentityEnv(t)
	e.run(t, consumer.Config{Inbox: pgrelay.InboxConfig{HandlerName: "ledger"}, Targets: []pgrelay.Target{
		{Handler: "ledger"}, {Handler: "mailer"}}})
	w, err := pgrelay.NewInboxWorker(pgrelay.InboxConfig{Pool: e.pool, Handler: charge("mailer"), HandlerName: "mailer",
		PollInterval: 50 * time.Millisecond, Logger: testLogger(t)})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()

	e.publish(t, "paid-1", "OrderPaid", `{"order_id":"o-7","amount_cents":700}`, nil)
	e.publish(t, "paid-1", "OrderPaid", `{"order_id":"o-7","amount_cents":700}`, nil)
	e.settle(t, "pgrelay-consumer-ledger")
	require.Equal(t, 1, e.charges(t, "ledger"))
	require.Equal(t, 1, e.charges(t, "mailer"))
	require.Equal(t, 2, e.count(t, `SELECT count(*) FROM pgrelay.inbox WHERE event_id = 'paid-1' AND status = 'processed'`))
}

// TestScenarioConflictListed: the same event id delivered with a different
// payload is not applied: the first payload's effect stands, the conflict is
// counted in consumer_key_conflicts_total{handler} and listed by
// `consumer conflicts list` with both event ids.
func TestScenarioConflictListed(t *testing.T) {
	t.Parallel()
	e := newIdentityEnv(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	metricsAddr := ln.Addr().String()
	require.NoError(t, ln.Close())
	e.run(t, consumer.Config{Inbox: pgrelay.InboxConfig{HandlerName: "ledger"}, MetricsAddr: metricsAddr})
	e.publish(t, "pay-1", "OrderPaid", `{"order_id":"o-1","amount_cents":100}`, nil)
	e.settle(t, "pgrelay-consumer-ledger")
	e.publish(t, "pay-1", "OrderPaid", `{"order_id":"o-1","amount_cents":100000}`, nil)
	e.settle(t, "pgrelay-consumer-ledger")

	require.Equal(t, 1, e.charges(t, "ledger"))
	require.Equal(t, 1, e.count(t, `SELECT count(*) FROM charges WHERE payload->>'amount_cents' = '100'`), "the first event's effect stands")

	var out bytes.Buffer
	url := e.url
	for _, cmd := range admincli.Commands(pgurl.One(&url)) {
		if cmd.Name() != "conflicts" {
			continue
		}
		cmd.SetArgs([]string{"list", "--json", "--handler", "ledger"})
		cmd.SetOut(&out)
		require.NoError(t, cmd.Execute())
	}
	var list []admin.Conflict
	require.NoError(t, json.Unmarshal(out.Bytes(), &list), out.String())
	require.Len(t, list, 1, out.String())
	require.Equal(t, "ledger", list[0].Handler)
	require.Equal(t, "pay-1", list[0].StoredEventID)
	require.Equal(t, "pay-1", list[0].EventID)
	require.Equal(t, `{"order_id":"o-1","amount_cents":100000}`, list[0].Payload)
	require.NotEqual(t, list[0].StoredFingerprint, list[0].Fingerprint)

	require.Eventually(t, func() bool {
		return metric(t, "http://"+metricsAddr+"/metrics", `consumer_key_conflicts_total{handler="ledger"}`) == 1
	}, 10*time.Second, 50*time.Millisecond)
}

// metric reads one series' value from a /metrics endpoint (-1 when absent).
func metric(t *testing.T, url, series string) float64 {
	t.Helper()
	resp, err := http.Get(url) //nolint:noctx // a test against a local endpoint
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			require.NoError(t, err)
			return f
		}
	}
	return -1
}
