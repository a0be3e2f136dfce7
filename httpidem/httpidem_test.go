package httpidem_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/httpidem"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

type response struct {
	Status   int
	Body     string
	Type     string
	Replayed bool
}

type bundle struct {
	pool *pgxpool.Pool
	srv  *httptest.Server
	mw   *httpidem.Middleware
	// hook, when set, runs inside the payment handler after its insert.
	hook func(ctx context.Context, r *http.Request)
	// fail makes the handler answer 502 after its insert.
	fail bool
	mu   sync.Mutex
}

// setup serves POST /payments: the handler inserts a charge row in the
// middleware's transaction and answers 201 with the charge id and the
// database time, so a response that ran twice could never be byte-identical.
func setup(t *testing.T, cfg httpidem.Config) *bundle {
	t.Helper()
	pool := testdb.New(t)
	createCharges(t, pool)
	b := newBundle(t, pool, cfg)
	b.srv = httptest.NewServer(b.mux())
	t.Cleanup(b.srv.Close)
	return b
}

func createCharges(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := pool.Exec(ctx, `CREATE TABLE charges (id bigserial PRIMARY KEY, order_id text NOT NULL, amount bigint NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`)
	require.NoError(t, err)
}

func newBundle(t *testing.T, pool *pgxpool.Pool, cfg httpidem.Config) *bundle {
	t.Helper()
	b := &bundle{pool: pool}
	cfg.Pool = pool
	var err error
	b.mw, err = httpidem.New(cfg)
	require.NoError(t, err)
	return b
}

func (b *bundle) mux() *http.ServeMux {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, ok := httpidem.Tx(r.Context())
		if !ok {
			http.Error(w, "no transaction", http.StatusInternalServerError)
			return
		}
		var p struct {
			OrderID string `json:"order_id"`
			Amount  int64  `json:"amount"`
		}
		if err := json.NewDecoder(r.Body).Decode(&p); err != nil || p.OrderID == "" {
			http.Error(w, "bad payment", http.StatusBadRequest)
			return
		}
		var id int64
		var at time.Time
		if err := tx.QueryRow(r.Context(), `INSERT INTO charges (order_id, amount) VALUES ($1, $2) RETURNING id, at`, p.OrderID, p.Amount).Scan(&id, &at); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		b.mu.Lock()
		hook, fail := b.hook, b.fail
		b.mu.Unlock()
		if fail {
			http.Error(w, "payment provider unavailable", http.StatusBadGateway)
			return
		}
		if hook != nil {
			hook(r.Context(), r)
			if _, err := tx.Exec(r.Context(), `UPDATE charges SET amount = amount WHERE id = $1`, id); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/payments/%d", id))
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(map[string]any{"charge_id": id, "order_id": p.OrderID, "amount": p.Amount, "at": at.Format(time.RFC3339Nano)})
	})
	mux := http.NewServeMux()
	mux.Handle("/payments", b.mw.Handler(h))
	return mux
}

func (b *bundle) setHook(f func(ctx context.Context, r *http.Request)) {
	b.mu.Lock()
	b.hook = f
	b.mu.Unlock()
}

// post sends a payment; it is safe from any goroutine: a client error comes
// back as Status -1 with the error as Body.
func (b *bundle) post(t *testing.T, key, body string) response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.srv.URL+"/payments", bytes.NewBufferString(body))
	if err != nil {
		return response{Status: -1, Body: err.Error()}
	}
	if key != "" {
		req.Header.Set(httpidem.HeaderName, key)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return response{Status: -1, Body: err.Error()}
	}
	defer res.Body.Close()
	got, err := io.ReadAll(res.Body)
	if err != nil {
		return response{Status: -1, Body: err.Error()}
	}
	return response{Status: res.StatusCode, Body: string(got), Type: res.Header.Get("Content-Type"), Replayed: res.Header.Get(httpidem.ReplayedHeader) == "true"}
}

func (b *bundle) count(t *testing.T, q string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n int
	require.NoError(t, b.pool.QueryRow(ctx, q).Scan(&n))
	return n
}

// waitNoAdvisoryLocks waits until no session holds an advisory lock in the
// test's database (a terminated backend releases its locks as it exits).
func (b *bundle) waitNoAdvisoryLocks(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database
			WHERE l.locktype = 'advisory' AND d.datname = current_database()`) == 0
	}, 20*time.Second, 20*time.Millisecond)
}

const payment = `{"order_id":"order-42","amount":1999}`

// TestDoubleClickedPayment: two requests with one Idempotency-Key make one
// charge, and the retry gets the first response byte for byte, from storage.
func TestDoubleClickedPayment(t *testing.T) {
	t.Parallel()
	b := setup(t, httpidem.Config{})
	first := b.post(t, `"pay-42-a"`, payment)
	second := b.post(t, `"pay-42-a"`, payment)
	t.Logf("first:  %d %s %s", first.Status, first.Type, first.Body)
	t.Logf("second: %d %s %s (replayed=%v)", second.Status, second.Type, second.Body, second.Replayed)
	require.Equal(t, http.StatusCreated, first.Status)
	require.False(t, first.Replayed)
	require.True(t, second.Replayed, "the retry is answered from storage")
	require.Equal(t, first.Status, second.Status)
	require.Equal(t, first.Type, second.Type)
	require.Equal(t, first.Body, second.Body, "byte for byte")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM charges`), "one charge")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM pgrelay.http_idempotency_keys`))

	// Another key is another payment.
	third := b.post(t, "pay-42-b", payment)
	require.Equal(t, http.StatusCreated, third.Status)
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM charges`))
}

// TestRetryStorm: many concurrent identical requests make one charge; every
// other answer is 409 (first still running) or the stored response.
func TestRetryStorm(t *testing.T) {
	t.Parallel()
	b := setup(t, httpidem.Config{})

	// Phase 1: the first request is held inside its handler while the
	// others arrive: every one of them must get 409 at once.
	started, gate := make(chan struct{}), make(chan struct{})
	var once sync.Once
	b.setHook(func(ctx context.Context, _ *http.Request) {
		once.Do(func() { close(started) })
		select {
		case <-gate:
		case <-ctx.Done(): // the client gave up
		}
	})
	firstDone := make(chan response, 1)
	go func() { firstDone <- b.post(t, "storm-1", payment) }()
	<-started
	const n = 16
	var wg sync.WaitGroup
	during := make(chan response, n)
	for range n {
		wg.Add(1)
		go func() { defer wg.Done(); during <- b.post(t, "storm-1", payment) }()
	}
	wg.Wait()
	close(during)
	for r := range during {
		require.Equal(t, http.StatusConflict, r.Status, r.Body)
		require.Equal(t, "application/problem+json", r.Type)
	}
	close(gate)
	first := <-firstDone
	require.Equal(t, http.StatusCreated, first.Status)

	// Phase 2: a burst of free-running clients on a fresh key.
	b.setHook(nil)
	all := make(chan response, n)
	for range n {
		wg.Add(1)
		go func() { defer wg.Done(); all <- b.post(t, "storm-2", payment) }()
	}
	wg.Wait()
	close(all)
	var created []response
	for r := range all {
		switch r.Status {
		case http.StatusConflict:
		case http.StatusCreated:
			created = append(created, r)
		default:
			t.Fatalf("unexpected %d: %s", r.Status, r.Body)
		}
	}
	require.NotEmpty(t, created)
	for _, r := range created {
		require.Equal(t, created[0].Body, r.Body, "every success is the one stored response")
	}
	after := b.post(t, "storm-2", payment)
	require.True(t, after.Replayed)
	require.Equal(t, created[0].Body, after.Body)
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM charges`), "one charge per key")
}

// TestKeyErrors: a different request under a used key gets 422, a missing
// key 400, a malformed key 400; other methods pass through.
func TestKeyErrors(t *testing.T) {
	t.Parallel()
	b := setup(t, httpidem.Config{})
	require.Equal(t, http.StatusCreated, b.post(t, "k-1", payment).Status)
	r := b.post(t, "k-1", `{"order_id":"order-42","amount":2999}`)
	require.Equal(t, http.StatusUnprocessableEntity, r.Status, r.Body)
	require.Equal(t, "application/problem+json", r.Type)
	r = b.post(t, "", payment)
	require.Equal(t, http.StatusBadRequest, r.Status, r.Body)
	require.Contains(t, r.Body, "missing")
	r = b.post(t, `"unterminated`, payment)
	require.Equal(t, http.StatusBadRequest, r.Status, r.Body)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM charges`))

	res, err := http.Get(b.srv.URL + "/payments")
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusInternalServerError, res.StatusCode, "GET runs the handler without a transaction")
}

// TestServerErrorNotStored: a 5xx rolls back the handler's writes and leaves
// the key free.
func TestServerErrorNotStored(t *testing.T) {
	t.Parallel()
	b := setup(t, httpidem.Config{})
	r := b.post(t, "bad-1", `{"order_id":"","amount":1}`)
	require.Equal(t, http.StatusBadRequest, r.Status, "a 4xx from the handler is an outcome: stored")
	require.True(t, b.post(t, "bad-1", `{"order_id":"","amount":1}`).Replayed)

	// The handler answers 502 after its insert, its transaction healthy
	// (a provider call failed): nothing of it may commit.
	b.mu.Lock()
	b.fail = true
	b.mu.Unlock()
	r = b.post(t, "err-1", payment)
	require.Equal(t, http.StatusBadGateway, r.Status)
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM charges`))
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM pgrelay.http_idempotency_keys WHERE key = 'err-1'`))
	b.mu.Lock()
	b.fail = false
	b.mu.Unlock()
	require.Equal(t, http.StatusCreated, b.post(t, "err-1", payment).Status, "the key is free again")
}

// TestCrashMidRequest kills the request's database connection
// (pg_terminate_backend) while the handler runs: its transaction rolls back,
// nothing is half stored, and a retry with the same key runs afresh.
func TestCrashMidRequest(t *testing.T) {
	t.Parallel()
	b := setup(t, httpidem.Config{})
	pid, gate := make(chan int, 1), make(chan struct{})
	b.setHook(func(ctx context.Context, r *http.Request) {
		tx, _ := httpidem.Tx(ctx)
		var p int
		_ = tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&p)
		pid <- p
		<-gate
	})
	done := make(chan response, 1)
	go func() { done <- b.post(t, "crash-1", payment) }()
	p := <-pid
	// While the first holds the key, a retry is refused.
	require.Equal(t, http.StatusConflict, b.post(t, "crash-1", payment).Status)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var killed bool
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, p).Scan(&killed))
	require.True(t, killed)
	close(gate)
	r := <-done
	require.Equal(t, http.StatusInternalServerError, r.Status, r.Body)
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM charges`), "the handler's write rolled back")
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM pgrelay.http_idempotency_keys`), "nothing half stored")

	// The killed backend answers its client before it releases its locks:
	// until it has, a retry gets 409 (and Retry-After), as a client would.
	b.waitNoAdvisoryLocks(t)
	b.setHook(nil)
	retry := b.post(t, "crash-1", payment)
	require.Equal(t, http.StatusCreated, retry.Status, retry.Body)
	require.False(t, retry.Replayed)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM charges`))
}

// TestExpiryAndClean: an expired key runs again, and Clean deletes expired
// keys in bounded batches.
func TestExpiryAndClean(t *testing.T) {
	t.Parallel()
	b := setup(t, httpidem.Config{CleanBatchSize: 7})
	first := b.post(t, "exp-1", payment)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var ttl float64
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT extract(epoch FROM expires_at - created_at) FROM pgrelay.http_idempotency_keys`).Scan(&ttl))
	require.InDelta(t, 24*3600, ttl, 1, "24 h by default")
	_, err := b.pool.Exec(ctx, `UPDATE pgrelay.http_idempotency_keys SET expires_at = now() - interval '1 second'`)
	require.NoError(t, err)
	again := b.post(t, "exp-1", payment)
	require.Equal(t, http.StatusCreated, again.Status)
	require.False(t, again.Replayed, "an expired key runs again")
	require.NotEqual(t, first.Body, again.Body)

	_, err = b.pool.Exec(ctx, `INSERT INTO pgrelay.http_idempotency_keys (key, fingerprint, method, path, status, expires_at)
		SELECT 'old-' || g, '\x00', 'POST', '/', 200, now() - interval '1 hour' FROM generate_series(1, 30) g`)
	require.NoError(t, err)
	n, err := b.mw.Clean(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 30, n)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM pgrelay.http_idempotency_keys`), "the live key stays")
}

func TestConfig(t *testing.T) {
	_, err := httpidem.New(httpidem.Config{})
	require.ErrorContains(t, err, "Pool")
	_, err = httpidem.New(httpidem.Config{Pool: &pgxpool.Pool{}, TTL: time.Millisecond})
	require.ErrorContains(t, err, "TTL")
}

// TestBadInputIsNotAnOutage: a key or a scope PostgreSQL text cannot hold (a
// NUL byte, invalid UTF-8) is the client's error, 400, never 503 "retry
// later" (a retry can never succeed); the handler does not run. The requests
// go straight to the handler: Go's HTTP client refuses to send a NUL.
func TestBadInputIsNotAnOutage(t *testing.T) {
	t.Parallel()
	b := setup(t, httpidem.Config{Scope: func(r *http.Request) string { return r.Header.Get("X-Client") }})
	send := func(key, client string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/payments", bytes.NewBufferString(payment))
		req.Header.Set(httpidem.HeaderName, key)
		req.Header.Set("X-Client", client)
		w := httptest.NewRecorder()
		b.mux().ServeHTTP(w, req)
		return w
	}
	for name, c := range map[string]struct{ key, client string }{
		"NUL in the key":                {"k\x00-1", "acme"},
		"NUL in a quoted key":           {"\"k\x00-1\"", "acme"},
		"invalid UTF-8 in the key":      {"k-\xff", "acme"},
		"invalid UTF-8 in a quoted key": {"\"k-\xc3\"", "acme"},
		"NUL in the scope":              {"k-1", "ac\x00me"},
		"invalid UTF-8 in the scope":    {"k-1", "acme-\xff"},
	} {
		w := send(c.key, c.client)
		require.Equal(t, http.StatusBadRequest, w.Code, "%s: %s", name, w.Body)
		require.Equal(t, "application/problem+json", w.Header().Get("Content-Type"), name)
	}
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM charges`), "the handler never ran")
	require.Equal(t, http.StatusCreated, send("k-1", "acme-✓").Code, "a valid key and scope work")
}
