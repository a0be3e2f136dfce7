package handlers_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/logtest"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// startWorker runs an inbox worker with h and short intervals until the test
// ends.
func startWorker(t testing.TB, pool *pgxpool.Pool, h pgrelay.InboxHandler) {
	t.Helper()
	startWorkerWith(t, testConfig(t, pool, h))
}

// testConfig is the worker configuration of startWorker.
func testConfig(t testing.TB, pool *pgxpool.Pool, h pgrelay.InboxHandler) pgrelay.InboxConfig {
	return pgrelay.InboxConfig{
		Pool: pool, Handler: h, Logger: logtest.New(t), Workers: 2, BatchSize: 20,
		Lease: 5 * time.Second, HandlerTimeout: 2 * time.Second, MaxAttempts: 5,
		BackoffMin: 5 * time.Millisecond, BackoffMax: 20 * time.Millisecond,
		PollInterval: 50 * time.Millisecond, DeferFallback: time.Hour, // only a release wakes a deferral
	}
}

// startWorkerWith runs an inbox worker with cfg until the test ends.
func startWorkerWith(t testing.TB, cfg pgrelay.InboxConfig) {
	t.Helper()
	w, err := pgrelay.NewInboxWorker(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	t.Cleanup(func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				t.Errorf("worker did not stop")
			}
		})
	})
}

// receive stores messages in the inbox and notifies the workers.
func receive(t testing.TB, pool *pgxpool.Pool, msgs ...pgrelay.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	in := make([]pgrelay.Incoming, len(msgs))
	for i, m := range msgs {
		if m.OccurredAt.IsZero() {
			m.OccurredAt = time.Now()
		}
		in[i] = pgrelay.Incoming{Message: m}
	}
	_, err := pgrelay.Receive(ctx, pool, in)
	require.NoError(t, err)
	require.NoError(t, pgrelay.NotifyInbox(ctx, pool))
}

// row is an inbox row's state.
type row struct {
	Status, LastError, WaitingFor string
	Attempts                      int
	HandlerStatus                 *int32
	HandlerLatencyMs              *float64
}

func inboxRow(t *testing.T, pool *pgxpool.Pool, id string) row {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var r row
	require.NoError(t, pool.QueryRow(ctx, `SELECT status, coalesce(last_error, ''), coalesce(waiting_for, ''), attempts,
		handler_status, handler_latency_ms FROM pgrelay.inbox WHERE event_id = $1`, id).
		Scan(&r.Status, &r.LastError, &r.WaitingFor, &r.Attempts, &r.HandlerStatus, &r.HandlerLatencyMs))
	return r
}

// waitStatus waits until the event's inbox row has status.
func waitStatus(t *testing.T, pool *pgxpool.Pool, id, status string) row {
	t.Helper()
	var r row
	require.Eventually(t, func() bool {
		r = inboxRow(t, pool, id)
		return r.Status == status
	}, 20*time.Second, 20*time.Millisecond, "event %s never reached %s", id, status)
	return r
}
