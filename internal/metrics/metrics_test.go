package metrics

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/logtest"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// scrape reads a Prometheus text endpoint into name{labels} -> value.
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		require.Positive(t, i, line)
		v, err := strconv.ParseFloat(line[i+1:], 64)
		require.NoError(t, err, line)
		out[line[:i]] = v
	}
	require.NoError(t, sc.Err())
	return out
}

type bundle struct {
	pool *pgxpool.Pool
	obs  *InboxObserver
	url  string
}

func setup(t *testing.T) *bundle {
	t.Helper()
	pool := testdb.New(t)
	reg := NewRegistry()
	obs := NewInboxObserver(reg, InboxObserverOptions{})
	coll, err := NewInboxCollector(DBCollectorConfig{Pool: pool, CacheFor: time.Nanosecond})
	require.NoError(t, err)
	reg.MustRegister(coll)
	NewRelayObserver(reg)
	srv, err := NewServer(ServerConfig{Registry: reg, Checks: map[string]Check{"database": PingCheck(pool)}})
	require.NoError(t, err)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return &bundle{pool: pool, obs: obs, url: hs.URL}
}

// TestSeriesPresentFromStartUp: every series, including every value of the
// reason labels, is exported as zero before anything happened.
func TestSeriesPresentFromStartUp(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m := scrape(t, b.url+"/metrics")
	want := []string{
		"consumer_received_total", "consumer_dedup_total", `consumer_processed_total{handler="default"}`,
		`consumer_claimed_total{handler="default"}`, `consumer_lease_takeovers_total{handler="default"}`,
		`consumer_fenced_total{handler="default"}`, `consumer_deferrals_total{handler="default"}`,
		`consumer_handler_duration_seconds_count{handler="default"}`, `consumer_key_conflicts_total{handler="default"}`,
		"relay_published_total", "relay_publish_errors_total", "relay_publish_duplicates_total",
		"relay_dead_total", "relay_fenced_total", "relay_lease_takeovers_total",
		"relay_lease_acquired_total", "relay_lease_lost_total", "relay_outbox_lag_seconds_count", "relay_publish_duration_seconds_count",
		"inbox_pending_rows", "inbox_processing_rows", "inbox_dead_rows",
		"inbox_oldest_claimable_age_seconds", "inbox_oldest_pending_age_seconds",
		"inbox_dedup_table_rows",
	}
	for _, r := range RetryReasons {
		want = append(want, fmt.Sprintf(`consumer_retries_total{handler="default",reason=%q}`, r))
	}
	for _, r := range DeadReasons {
		want = append(want, fmt.Sprintf(`consumer_dlq_total{handler="default",reason=%q}`, r))
	}
	for _, name := range want {
		v, ok := m[name]
		require.True(t, ok, "series %s missing at start-up", name)
		require.Zero(t, v, name)
	}
	require.Equal(t, 1.0, m["inbox_db_stats_up"])
	require.Positive(t, m["inbox_dedup_table_bytes"])
	require.Contains(t, m, "go_goroutines", "runtime collectors are registered")
}

func msg(id string) pgrelay.Incoming {
	return pgrelay.Incoming{Message: pgrelay.Message{EventID: id, Topic: "orders", Key: id, EventType: "OrderPaid", Payload: []byte(`{}`)}}
}

// TestMetricsFollowTheRealInbox drives duplicates, retries and dead letters
// through the real inbox (Receive and a running Worker) and reads /metrics
// over HTTP until the counters say what happened.
func TestMetricsFollowTheRealInbox(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()

	// The delivery counters (consumer_received_total, consumer_dedup_total)
	// come from the consumer's ingest loop: cmd/consumer's
	// TestIngestCountersAndHitRateFromTheRealPath drives them through
	// JetStream. Here the inbox worker alone drives the counters.
	receive := func(msgs ...pgrelay.Incoming) {
		_, err := pgrelay.Receive(ctx, b.pool, msgs)
		require.NoError(t, err)
	}
	receive(msg("ok"), msg("flaky"), msg("poison"), msg("hopeless"))
	receive(msg("ok"), msg("flaky")) // redeliveries: absorbed

	m := scrape(t, b.url+"/metrics")
	require.Equal(t, 4.0, m["inbox_pending_rows"])

	var mu sync.Mutex
	calls := map[string]int{}
	handler := pgrelay.HandlerFunc(func(_ context.Context, _ pgx.Tx, ev *pgrelay.InboxEvent) error {
		mu.Lock()
		calls[ev.EventID]++
		n := calls[ev.EventID]
		mu.Unlock()
		switch ev.EventID {
		case "flaky":
			if n == 1 {
				return errors.New("ledger unavailable")
			}
		case "poison":
			return pgrelay.Permanent(errors.New("unknown order"))
		case "hopeless":
			return errors.New("still broken")
		}
		return nil
	})
	w, err := pgrelay.NewInboxWorker(pgrelay.InboxConfig{
		Pool: b.pool, Handler: handler, Observer: b.obs, Logger: logtest.New(t),
		Workers: 1, MaxAttempts: 2, Lease: 5 * time.Second, HandlerTimeout: 2 * time.Second,
		BackoffMin: 5 * time.Millisecond, BackoffMax: 10 * time.Millisecond, PollInterval: 20 * time.Millisecond,
	})
	require.NoError(t, err)
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	t.Cleanup(func() { cancel(); <-done })

	require.Eventually(t, func() bool {
		m = scrape(t, b.url+"/metrics")
		return m[`consumer_processed_total{handler="default"}`] == 2 && m["inbox_dead_rows"] == 2 && m["inbox_pending_rows"] == 0
	}, 20*time.Second, 20*time.Millisecond, "the processed and dead counts never matched")

	require.Equal(t, 2.0, m[`consumer_retries_total{handler="default",reason="error"}`], "flaky once, hopeless once")
	require.Equal(t, 0.0, m[`consumer_retries_total{handler="default",reason="panic"}`])
	require.Equal(t, 1.0, m[`consumer_dlq_total{handler="default",reason="permanent"}`])
	require.Equal(t, 1.0, m[`consumer_dlq_total{handler="default",reason="attempts_exhausted"}`])
	require.Equal(t, 0.0, m[`consumer_dlq_total{handler="default",reason="other"}`])
	require.Equal(t, 2.0, m[`consumer_handler_duration_seconds_count{handler="default"}`])
	require.Equal(t, 0.0, m[`consumer_fenced_total{handler="default"}`])
	require.GreaterOrEqual(t, m[`consumer_claimed_total{handler="default"}`], 6.0)
	require.Equal(t, 0.0, m["inbox_oldest_claimable_age_seconds"])
}

// TestOldestClaimableIgnoresBackoff: the age gauge counts rows that are due,
// and not rows waiting out a backoff.
func TestOldestClaimableIgnoresBackoff(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.pool.Exec(context.Background(), `INSERT INTO pgrelay.inbox (event_id, received_at, next_attempt_at) VALUES
		('backing-off', now() - interval '1 hour', now() + interval '1 hour')`)
	require.NoError(t, err)
	m := scrape(t, b.url+"/metrics")
	require.Equal(t, 0.0, m["inbox_oldest_claimable_age_seconds"], "nothing is claimable")
	require.InDelta(t, 3600, m["inbox_oldest_pending_age_seconds"], 30)

	_, err = b.pool.Exec(context.Background(), `INSERT INTO pgrelay.inbox (event_id, received_at, next_attempt_at) VALUES
		('due', now() - interval '2 minutes', now() - interval '90 seconds')`)
	require.NoError(t, err)
	m = scrape(t, b.url+"/metrics")
	require.InDelta(t, 90, m["inbox_oldest_claimable_age_seconds"], 30)
	require.InDelta(t, 3600, m["inbox_oldest_pending_age_seconds"], 30)
	require.Equal(t, 2.0, m["inbox_pending_rows"])
}

// TestDBGaugesSurviveAnOutage: when the database cannot be queried the gauges
// keep their last values (no series disappears) and inbox_db_stats_up is 0.
func TestDBGaugesSurviveAnOutage(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), testdb.NewURL(t))
	require.NoError(t, err)
	_, err = pool.Exec(context.Background(), `INSERT INTO pgrelay.inbox (event_id) VALUES ('a'), ('b')`)
	require.NoError(t, err)
	reg := NewRegistry()
	coll, err := NewInboxCollector(DBCollectorConfig{Pool: pool, CacheFor: time.Nanosecond, Timeout: time.Second})
	require.NoError(t, err)
	reg.MustRegister(coll)
	srv, err := NewServer(ServerConfig{Registry: reg})
	require.NoError(t, err)
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()

	m := scrape(t, hs.URL+"/metrics")
	require.Equal(t, 2.0, m["inbox_pending_rows"])
	require.Equal(t, 1.0, m["inbox_db_stats_up"])
	pool.Close()
	m = scrape(t, hs.URL+"/metrics")
	require.Equal(t, 2.0, m["inbox_pending_rows"], "last known value")
	require.Equal(t, 0.0, m["inbox_db_stats_up"])
}

func TestHealthAndReadiness(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	brokerDown := errors.New("nats: no servers available")
	var brokerErr error
	var mu sync.Mutex
	var slow, hung atomic.Bool
	release := make(chan struct{})
	defer close(release)
	srv, err := NewServer(ServerConfig{Registry: NewRegistry(), Checks: map[string]Check{
		"database": PingCheck(pool),
		"broker": func(context.Context) error {
			mu.Lock()
			defer mu.Unlock()
			return brokerErr
		},
		// slow answers nil, but only once its deadline passed; hung ignores
		// its context altogether. Either is a failed check.
		"slow": func(ctx context.Context) error {
			if slow.Load() {
				<-ctx.Done()
			}
			return nil
		},
		"hung": func(context.Context) error {
			if hung.Load() {
				<-release
			}
			return nil
		},
	}, CheckTimeout: time.Second})
	// The database check must not time out on a loaded machine: its pool is
	// connected first, and the timeout leaves room for a slow ping.
	require.NoError(t, pool.Ping(context.Background()))
	require.NoError(t, err)
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()

	get := func(path string) (int, string) {
		resp, err := http.Get(hs.URL + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(body)
	}
	code, _ := get("/healthz")
	require.Equal(t, http.StatusOK, code)
	code, body := get("/readyz")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `"database":"ok"`)

	mu.Lock()
	brokerErr = brokerDown
	mu.Unlock()
	code, body = get("/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, body, `"broker":"nats: no servers available"`)
	for _, live := range []string{"/livez", "/healthz"} {
		code, _ = get(live)
		require.Equal(t, http.StatusOK, code, "%s: liveness does not depend on the broker", live)
	}

	mu.Lock()
	brokerErr = nil
	mu.Unlock()
	slow.Store(true)
	code, body = get("/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code, "a check that timed out is not ok: %s", body)
	require.Contains(t, body, `"slow":"check timed out after 1s"`)
	slow.Store(false)
	hung.Store(true)
	start := time.Now()
	code, body = get("/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code, body)
	require.Contains(t, body, `"hung":"check timed out after 1s"`)
	require.Less(t, time.Since(start), 5*time.Second, "a check ignoring its context must not hold /readyz")
	hung.Store(false)
	code, body = get("/readyz")
	require.Equal(t, http.StatusOK, code, body)
}

func TestServerConfigValidation(t *testing.T) {
	t.Parallel()
	_, err := NewServer(ServerConfig{})
	require.ErrorContains(t, err, "Registry")
	_, err = NewServer(ServerConfig{Registry: NewRegistry(), Addr: "nonsense"})
	require.ErrorContains(t, err, "--metrics-addr")
	_, err = NewServer(ServerConfig{Registry: NewRegistry(), Checks: map[string]Check{"db": nil}})
	require.ErrorContains(t, err, `Checks["db"]`)
	_, err = NewInboxCollector(DBCollectorConfig{})
	require.ErrorContains(t, err, "DBCollectorConfig.Pool")
}

// TestServerRunsAndStops: Run serves until its context is cancelled, then
// returns nil.
func TestServerRunsAndStops(t *testing.T) {
	t.Parallel()
	srv, err := NewServer(ServerConfig{Registry: NewRegistry(), Addr: "127.0.0.1:0"})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("server did not stop")
	}
}

func TestClassify(t *testing.T) {
	t.Parallel()
	require.Equal(t, RetryPanic, ClassifyRetry("handler panicked: boom"))
	require.Equal(t, RetryTimeout, ClassifyRetry("handler timed out after 10s: context deadline exceeded"))
	require.Equal(t, RetryError, ClassifyRetry("connection refused"))
	require.Equal(t, DeadPermanent, ClassifyDead("permanent: unknown order"))
	require.Equal(t, DeadWorkerLost, ClassifyDead("attempts exhausted: worker lost during attempt 10 of 10"))
	require.Equal(t, DeadAttemptsExhausted, ClassifyDead("attempts exhausted: 10 of 10: boom"))
	require.Equal(t, DeadDeferralsExhausted, ClassifyDead("deferrals exhausted: still waiting for order:1 after 20 deferrals"))
	require.Equal(t, DeadOther, ClassifyDead("something else"))
}

// TestOutboxGauges: the relay's DB gauges count pending and dead rows and the
// age of the oldest pending row, ignoring rows backing off.
func TestOutboxGauges(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	reg := NewRegistry()
	coll, err := NewOutboxCollector(DBCollectorConfig{Pool: pool, CacheFor: time.Nanosecond})
	require.NoError(t, err)
	reg.MustRegister(coll)
	srv, err := NewServer(ServerConfig{Registry: reg})
	require.NoError(t, err)
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()

	m := scrape(t, hs.URL+"/metrics")
	for _, name := range []string{"outbox_pending_rows", "outbox_dead_rows", "outbox_oldest_pending_age_seconds"} {
		v, ok := m[name]
		require.True(t, ok, name)
		require.Zero(t, v, name)
	}
	ctx := context.Background()
	_, err = pool.Exec(ctx, `INSERT INTO pgrelay.outbox (event_id, topic, key) VALUES ('a', 't', 'a'), ('b', 't', 'b'), ('c', 't', 'c'), ('d', 't', 'd')`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE pgrelay.outbox SET created_at = now() - interval '2 minutes' WHERE event_id = 'a'`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE pgrelay.outbox SET created_at = now() - interval '1 hour', next_attempt_at = now() + interval '1 minute' WHERE event_id = 'b'`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE pgrelay.outbox SET status = 'dead', last_error = 'too large' WHERE event_id = 'c'`)
	require.NoError(t, err)
	m = scrape(t, hs.URL+"/metrics")
	require.Equal(t, 3.0, m["outbox_pending_rows"])
	require.Equal(t, 1.0, m["outbox_dead_rows"])
	require.InDelta(t, 120, m["outbox_oldest_pending_age_seconds"], 30, "the row backing off is ignored")
	require.Positive(t, m["outbox_table_bytes"])
	require.Equal(t, 1.0, m["outbox_db_stats_up"])
}

// TestIngestStatsAreReadAtScrape: with IngestStats, the received, duplicate
// and ingest error counters are the ingest side's own totals.
func TestIngestStatsAreReadAtScrape(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	st := IngestStats{}
	reg := NewRegistry()
	obs := NewInboxObserver(reg, InboxObserverOptions{IngestStats: func() IngestStats {
		mu.Lock()
		defer mu.Unlock()
		return st
	}})
	srv, err := NewServer(ServerConfig{Registry: reg})
	require.NoError(t, err)
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	m := scrape(t, hs.URL+"/metrics")
	require.Zero(t, m["consumer_received_total"])
	require.Contains(t, m, "consumer_fetch_errors_total")

	mu.Lock()
	st = IngestStats{Received: 10, Duplicates: 3, Dead: 1, StoreErrors: 2, FetchErrors: 4}
	mu.Unlock()
	obs.Received(100, 100) // ignored: the ingest side's totals win
	m = scrape(t, hs.URL+"/metrics")
	require.Equal(t, 10.0, m["consumer_received_total"])
	require.Equal(t, 3.0, m["consumer_dedup_total"])
	require.Equal(t, 1.0, m["consumer_ingest_dead_total"])
	require.Equal(t, 2.0, m["consumer_store_errors_total"])
	require.Equal(t, 4.0, m["consumer_fetch_errors_total"])
}

// TestFencedAndTakeoverMetrics drives a lease takeover and a fenced commit
// through the real inbox worker: a row left processing by a dead worker is
// taken over, and a handler whose claim is taken over while it runs (the
// fencing version moves on) has its commit refused.
func TestFencedAndTakeoverMetrics(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	// A worker died holding this event: its lease expired a minute ago.
	_, err := b.pool.Exec(ctx, `INSERT INTO pgrelay.inbox (event_id, status, attempts, lock_version, locked_by, locked_until)
		VALUES ('orphan', 'processing', 1, 1, 'dead-worker', now() - interval '1 minute')`)
	require.NoError(t, err)
	res, err := pgrelay.Receive(ctx, b.pool, []pgrelay.Incoming{msg("overtaken")})
	require.NoError(t, err)
	b.obs.Received(res.Inserted, len(res.Duplicates))

	var once sync.Once
	handler := pgrelay.HandlerFunc(func(ctx context.Context, _ pgx.Tx, ev *pgrelay.InboxEvent) error {
		if ev.EventID == "overtaken" {
			once.Do(func() {
				// Another worker takes the claim over while this one runs.
				_, err := b.pool.Exec(ctx, `UPDATE pgrelay.inbox SET lock_version = lock_version + 1 WHERE event_id = 'overtaken'`)
				require.NoError(t, err)
			})
		}
		return nil
	})
	w, err := pgrelay.NewInboxWorker(pgrelay.InboxConfig{
		Pool: b.pool, Handler: handler, Observer: b.obs, Logger: logtest.New(t),
		Workers: 1, Lease: 30 * time.Second, HandlerTimeout: 2 * time.Second, PollInterval: 20 * time.Millisecond,
	})
	require.NoError(t, err)
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	t.Cleanup(func() { cancel(); <-done })

	var m map[string]float64
	require.Eventually(t, func() bool {
		m = scrape(t, b.url+"/metrics")
		return m[`consumer_fenced_total{handler="default"}`] == 1 && m[`consumer_lease_takeovers_total{handler="default"}`] == 1
	}, 20*time.Second, 20*time.Millisecond, "the fenced and takeover counters never reached 1")
	require.Equal(t, 1.0, m[`consumer_processed_total{handler="default"}`], "the orphan is processed; the overtaken commit is not")
	require.Equal(t, 1.0, m["inbox_processing_rows"], "the overtaken event waits for its lease to expire")
}
