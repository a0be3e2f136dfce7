package handlers_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/handlers"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// countingReceiver is a webhook receiver that does not deduplicate: it counts
// every request per event id (Idempotency-Key) with the attempt it carried,
// and answers 500 to the first request for the events in failFirst.
type countingReceiver struct {
	failFirst map[string]bool
	delay     time.Duration

	mu       sync.Mutex
	attempts map[string][]int // the Pgrelay-Attempt of each request, per event id
}

func newCountingReceiver(failFirst ...string) *countingReceiver {
	r := &countingReceiver{failFirst: map[string]bool{}, attempts: map[string][]int{}}
	for _, id := range failFirst {
		r.failFirst[id] = true
	}
	return r
}

func (c *countingReceiver) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	id := r.Header.Get("Idempotency-Key")
	attempt, _ := strconv.Atoi(r.Header.Get("Pgrelay-Attempt"))
	c.mu.Lock()
	c.attempts[id] = append(c.attempts[id], attempt)
	n := len(c.attempts[id])
	c.mu.Unlock()
	if c.delay > 0 {
		time.Sleep(c.delay)
	}
	if c.failFirst[id] && n == 1 {
		rw.WriteHeader(http.StatusInternalServerError)
		return
	}
	rw.WriteHeader(http.StatusNoContent)
}

func (c *countingReceiver) requests() map[string][]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string][]int, len(c.attempts))
	for k, v := range c.attempts {
		out[k] = slices.Clone(v)
	}
	return out
}

// webhookEvents returns n events with ids e000, e001, ...
func webhookEvents(n int) []pgrelay.Message {
	msgs := make([]pgrelay.Message, n)
	for i := range msgs {
		id := fmt.Sprintf("e%03d", i)
		msgs[i] = pgrelay.Message{EventID: id, Topic: "orders", Key: "k-" + id, EventType: "OrderPaid",
			Payload: []byte(`{"id":"` + id + `"}`)}
	}
	return msgs
}

// waitProcessed waits until n inbox rows are processed.
func waitProcessed(t testing.TB, pool *pgxpool.Pool, n int, within time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var done int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pgrelay.inbox WHERE status = 'processed'`).Scan(&done))
		return done == n
	}, within, 10*time.Millisecond, "%d events never all processed", n)
}

// TestHTTPHandlerPostsEachSuccessOnce: 200 events in full batches, three of
// which the receiver answers 500 the first time. A webhook call that answered
// 2xx is never made again by the inbox's own retry mechanics (a failing
// event's batch is not rerun with the others' calls in it): every event that
// never failed is POSTed exactly once, and each failing one once per attempt.
func TestHTTPHandlerPostsEachSuccessOnce(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	failing := []string{"e017", "e093", "e160"}
	hook := newCountingReceiver(failing...)
	srv := httptest.NewServer(hook)
	defer srv.Close()

	h, err := handlers.NewHTTP(handlers.HTTPConfig{URL: srv.URL, Timeout: time.Second, Recorder: pool})
	require.NoError(t, err)
	msgs := webhookEvents(200)
	receive(t, pool, msgs...) // all stored before the worker starts: full batches
	cfg := testConfig(t, pool, h)
	cfg.BatchSize, cfg.Logger = 50, nil
	startWorkerWith(t, cfg)
	waitProcessed(t, pool, len(msgs), time.Minute)

	got := hook.requests()
	var repeated []string
	for _, m := range msgs {
		id := m.EventID
		if slices.Contains(failing, id) {
			require.Equal(t, []int{1, 2}, got[id], "%s: failed once, so POSTed once per attempt", id)
			require.Equal(t, 2, inboxRow(t, pool, id).Attempts)
			continue
		}
		if len(got[id]) != 1 {
			repeated = append(repeated, fmt.Sprintf("%s %v", id, got[id]))
		}
	}
	require.Empty(t, repeated, "%d events that never failed were POSTed more than once (attempts per request)", len(repeated))
}
