package pgrelay_test

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/ledger"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// startBoundedWorker runs a worker whose claims keep a bound with margin and
// scan from the start only every fullEvery, until the test ends.
func startBoundedWorker(t *testing.T, cfg pgrelay.InboxConfig, margin, fullEvery time.Duration) {
	t.Helper()
	w, err := pgrelay.NewInboxWorker(cfg)
	require.NoError(t, err)
	pgrelay.SetClaimFloor(w, margin, fullEvery)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Errorf("worker did not stop")
		}
	})
}

// TestClaimBoundRetriedRowClaimedWithinBackoff: an event that failed is
// pending again with a next_attempt_at far below the bound that the events
// claimed since have raised; it is still claimed when its backoff is over,
// by the bounded claims alone (no claim from the start in the test's time).
func TestClaimBoundRetriedRowClaimedWithinBackoff(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	createOrders(t, pool, "o1")
	const backoff = 400 * time.Millisecond
	var failedAt atomic.Int64
	h := pgrelay.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
		if err := (ledger.Handler{}).Handle(ctx, tx, ev); err != nil {
			return err
		}
		if ev.EventID == "low" && failedAt.CompareAndSwap(0, time.Now().UnixNano()) {
			return errors.New("downstream hiccup")
		}
		return nil
	})
	cfg := fastConfig(t, pool, h)
	cfg.Workers, cfg.BatchSize = 1, 5
	cfg.BackoffMin, cfg.BackoffMax = backoff, backoff
	receive(t, pool, orderPaid("low", "o1", 1))
	startBoundedWorker(t, cfg, 50*time.Millisecond, time.Hour)

	// A steady stream of later events moves the bound on, past the retried
	// row's first next_attempt_at and around its second.
	ctx, stop := context.WithCancel(context.Background())
	streamed := make(chan error, 1)
	go func() {
		for i := 0; ctx.Err() == nil; i++ {
			if _, err := pgrelay.Receive(ctx, pool, []pgrelay.Incoming{orderPaid("later-"+strconv.Itoa(i), "o1", 1)}); err != nil && ctx.Err() == nil {
				streamed <- err
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Millisecond):
			}
		}
		streamed <- nil
	}()
	r := waitStatus(t, pool, "low", "processed", 10*time.Second)
	stop()
	require.NoError(t, <-streamed)
	require.Equal(t, 2, r.Attempts)
	took := time.Duration(queryInt(t, pool,
		`SELECT (extract(epoch FROM finished_at - started_at) * 1000)::int FROM pgrelay.inbox WHERE event_id = 'low'`)) * time.Millisecond
	require.NotZero(t, failedAt.Load())
	retried := time.Since(time.Unix(0, failedAt.Load()))
	t.Logf("retried %s after the failure, second attempt took %s", retried, took)
	require.Less(t, retried, backoff+2*time.Second, "the retried row waited far past its backoff")
}

// TestClaimFromStartFindsRowBelowBound: a row that becomes pending below the
// claims' bound (here stored with a next_attempt_at a minute old, as a store
// or a release committing late leaves it) is claimed by the next claim from
// the start.
func TestClaimFromStartFindsRowBelowBound(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	createOrders(t, pool, "o1")
	cfg := fastConfig(t, pool, ledger.Handler{})
	cfg.Workers = 1
	startBoundedWorker(t, cfg, 50*time.Millisecond, 300*time.Millisecond)
	for i := range 10 {
		receive(t, pool, orderPaid("first-"+strconv.Itoa(i), "o1", 1))
	}
	waitAllDone(t, pool, 10*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := pgrelay.ReceiveWith(ctx, tx, []pgrelay.Incoming{orderPaid("late", "o1", 1)}, pgrelay.ReceiveOptions{}); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE pgrelay.inbox SET next_attempt_at = now() - interval '1 minute' WHERE event_id = 'late'`)
		return err
	}))
	waitStatus(t, pool, "late", "processed", 5*time.Second)
}

// TestClaimBoundHeldByLongBatch: a batch that runs longer than the bound's
// margin stamps its retry with its transaction's start, while the other
// worker goroutine claims later events and raises the bound past that; the
// batch holds the bound until a claim has seen its commit, so the retry is
// still claimed when its backoff is over.
func TestClaimBoundHeldByLongBatch(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	createOrders(t, pool, "o1")
	const backoff = 100 * time.Millisecond
	var failedAt atomic.Int64
	h := pgrelay.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
		if err := (ledger.Handler{}).Handle(ctx, tx, ev); err != nil {
			return err
		}
		switch {
		case ev.EventID == "sleeper":
			time.Sleep(600 * time.Millisecond)
		case ev.EventID == "slow" && failedAt.Load() == 0:
			failedAt.Store(time.Now().UnixNano())
			return errors.New("downstream hiccup")
		}
		return nil
	})
	cfg := fastConfig(t, pool, h)
	cfg.Workers, cfg.BatchSize = 2, 2
	cfg.BackoffMin, cfg.BackoffMax = backoff, backoff
	// One batch: the sleeper first (arrival order), then the event that
	// fails, whose retry is stamped with the batch transaction's start.
	receive(t, pool, orderPaid("sleeper", "o1", 1), orderPaid("slow", "o1", 1))
	startBoundedWorker(t, cfg, 50*time.Millisecond, time.Hour)

	ctx, stop := context.WithCancel(context.Background())
	streamed := make(chan error, 1)
	go func() {
		for i := 0; ctx.Err() == nil; i++ {
			if _, err := pgrelay.Receive(ctx, pool, []pgrelay.Incoming{orderPaid("later-"+strconv.Itoa(i), "o1", 1)}); err != nil && ctx.Err() == nil {
				streamed <- err
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Millisecond):
			}
		}
		streamed <- nil
	}()
	r := waitStatus(t, pool, "slow", "processed", 10*time.Second)
	stop()
	require.NoError(t, <-streamed)
	require.Equal(t, 2, r.Attempts)
	retried := time.Since(time.Unix(0, failedAt.Load()))
	t.Logf("retried %s after the failure", retried)
	require.Less(t, retried, backoff+2*time.Second, "the retried row waited far past its backoff")
}
