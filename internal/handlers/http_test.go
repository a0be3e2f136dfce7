package handlers_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/handlers"
	"github.com/pgrelay/pgrelay/internal/logtest"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// webhook is a real HTTP server whose answer depends on the event: it counts
// the requests per Idempotency-Key and records what it applied.
type webhook struct {
	mu       sync.Mutex
	requests map[string]int
	applied  map[string]int // successful answers per key
	bodies   map[string][]byte
	headers  map[string]http.Header
}

func (w *webhook) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	body, _ := io.ReadAll(r.Body)
	w.mu.Lock()
	w.requests[key]++
	n := w.requests[key]
	w.bodies[key], w.headers[key] = body, r.Header.Clone()
	w.mu.Unlock()
	status := http.StatusOK
	switch r.Header.Get(event.HeaderEventType) {
	case "FailTwice": // 500, 503, then success
		if n <= 2 {
			status = []int{500, 503}[n-1]
		}
	case "TimeoutOnce": // the first request outlives the client's timeout
		if n == 1 {
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
			return
		}
	case "Late": // slow, but within the timeout
		time.Sleep(300 * time.Millisecond)
	case "NotFound":
		status = http.StatusNotFound
	case "TooMany": // 429 is retried
		if n == 1 {
			status = http.StatusTooManyRequests
		}
	}
	if status/100 == 2 {
		w.mu.Lock()
		w.applied[key]++
		w.mu.Unlock()
	}
	rw.WriteHeader(status)
	_, _ = rw.Write([]byte("answer " + http.StatusText(status)))
}

func TestHTTPHandlerOutcomes(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	hook := &webhook{requests: map[string]int{}, applied: map[string]int{}, bodies: map[string][]byte{},
		headers: map[string]http.Header{}}
	srv := httptest.NewServer(hook)
	defer srv.Close()

	h, err := handlers.NewHTTP(handlers.HTTPConfig{URL: srv.URL + "/events", Timeout: time.Second,
		Recorder: pool, Logger: logtest.New(t)})
	require.NoError(t, err)
	startWorker(t, pool, h)

	msg := func(id, typ string) pgrelay.Message {
		return pgrelay.Message{EventID: id, Topic: "orders", Key: "k-" + id, EventType: typ,
			Payload: []byte(`{"id":"` + id + `"}`), Headers: map[string]string{"Traceparent": "00-abc-" + id, "bad\nname": "x"}}
	}
	sequenced := msg("ok", "Ok")
	sequenced.KeySeq = 3
	receive(t, pool, sequenced, msg("fail", "FailTwice"), msg("timeout", "TimeoutOnce"),
		msg("late", "Late"), msg("gone", "NotFound"), msg("busy", "TooMany"))
	receive(t, pool, sequenced) // a redelivery: stored once, posted once

	ok := waitStatus(t, pool, "ok", "processed")
	require.Equal(t, int32(200), *ok.HandlerStatus)
	fail := waitStatus(t, pool, "fail", "processed")
	require.Equal(t, 3, fail.Attempts, "5xx is retried")
	require.Equal(t, int32(200), *fail.HandlerStatus)
	timeout := waitStatus(t, pool, "timeout", "processed")
	require.Equal(t, 2, timeout.Attempts, "a timeout is retried")
	late := waitStatus(t, pool, "late", "processed")
	require.Equal(t, 1, late.Attempts, "a late answer within the timeout succeeds")
	require.GreaterOrEqual(t, *late.HandlerLatencyMs, 300.0, "the latency is recorded")
	busy := waitStatus(t, pool, "busy", "processed")
	require.Equal(t, 2, busy.Attempts, "429 is retried")
	gone := waitStatus(t, pool, "gone", "dead")
	require.Equal(t, 1, gone.Attempts, "404 is permanent")
	require.Contains(t, gone.LastError, `permanent: webhook answered 404 Not Found after`)
	require.Contains(t, gone.LastError, `"answer Not Found"`)
	require.Equal(t, int32(404), *gone.HandlerStatus, "a failed attempt's status is recorded too")

	hook.mu.Lock()
	defer hook.mu.Unlock()
	// Each event answered 2xx once: a success is not posted again for another
	// event's failure (TestHTTPHandlerPostsEachSuccessOnce).
	for _, id := range []string{"ok", "fail", "timeout", "late", "busy"} {
		require.Equal(t, 1, hook.applied[id], "%s applied", id)
	}
	require.Zero(t, hook.applied["gone"])
	require.Equal(t, `{"id":"ok"}`, string(hook.bodies["ok"]))
	hd := hook.headers["ok"]
	require.Equal(t, "ok", hd.Get("Idempotency-Key"))
	require.Equal(t, "00-abc-ok", hd.Get("Traceparent"), "the event's headers are sent")
	require.Equal(t, "Ok", hd.Get("Pgrelay-Event-Type"))
	require.Equal(t, "k-ok", hd.Get("Pgrelay-Key"))
	require.Equal(t, "3", hd.Get("Pgrelay-Key-Seq"), "the per-key sequence is sent")
	require.Empty(t, hook.headers["late"].Values("Pgrelay-Key-Seq"), "an event without one sends none")
	require.Equal(t, "application/json", hd.Get("Content-Type"))
}

func TestHTTPHandlerConnectionRefused(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close() // nothing listens there any more

	h, err := handlers.NewHTTP(handlers.HTTPConfig{URL: url, Timeout: time.Second, Recorder: pool})
	require.NoError(t, err)
	startWorker(t, pool, h)
	receive(t, pool, pgrelay.Message{EventID: "refused", Topic: "t", EventType: "X", Payload: []byte(`{}`)})
	dead := waitStatus(t, pool, "refused", "dead")
	require.Equal(t, 5, dead.Attempts, "a connection error is transient: retried until the attempts run out")
	require.Contains(t, dead.LastError, "attempts exhausted: 5 of 5: webhook POST failed")
	require.Nil(t, dead.HandlerStatus, "no response, no status")
	require.NotNil(t, dead.HandlerLatencyMs)

	_, err = handlers.NewHTTP(handlers.HTTPConfig{URL: "ftp://x"})
	require.ErrorContains(t, err, "HTTPConfig.URL")
}
