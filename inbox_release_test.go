package pgrelay_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/ledger"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// inOrder makes the events due and received in the given order, so that
// claims of BatchSize events split them into the batches a test needs.
func inOrder(t *testing.T, pool *pgxpool.Pool, ids ...string) {
	t.Helper()
	for i, id := range ids {
		_, err := pool.Exec(context.Background(), `UPDATE pgrelay.inbox
			SET received_at = now() - interval '1 minute' + $2 * interval '1 ms',
			    next_attempt_at = now() - interval '1 minute' + $2 * interval '1 ms'
			WHERE event_id = $1`, id, i)
		require.NoError(t, err)
	}
}

func created(eventID, orderID string) pgrelay.Incoming {
	return pgrelay.Incoming{Message: orderCreatedMessage(eventID, orderID)}
}

func blocker(eventID string) pgrelay.Incoming {
	return pgrelay.Incoming{Message: pgrelay.Message{EventID: eventID, EventType: "Block", Payload: []byte("{}")}}
}

// TestCrossedDeferralsAndReleasesDoNotDeadlock: batch A [Paid(o1), Created(o2)]
// and batch B [Paid(o2), Created(o1)] run at the same time, each releasing
// what the other deferred on. No batch may fail (a deadlock used to roll one
// back and burn an attempt of a healthy OrderCreated), and neither OrderPaid
// may miss its release (the fallback is a minute away).
func TestCrossedDeferralsAndReleasesDoNotDeadlock(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	receive(t, pool, orderPaid("a1-pay-o1", "o1", 100), created("a2-create-o2", "o2"),
		orderPaid("b1-pay-o2", "o2", 100), created("b2-create-o1", "o1"))
	inOrder(t, pool, "a1-pay-o1", "a2-create-o2", "b1-pay-o2", "b2-create-o1")

	// Each OrderCreated waits until both batches have deferred their OrderPaid.
	var arrived atomic.Int32
	both, closeBoth := onceChan()
	h := pgrelay.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
		if ev.EventType == ledger.EventOrderCreated && ev.Attempts == 1 {
			if arrived.Add(1) == 2 {
				closeBoth()
			}
			select {
			case <-both:
			case <-time.After(5 * time.Second):
			}
		}
		return ledger.Handler{}.Handle(ctx, tx, ev)
	})
	// Worker A claims the first two events before worker B starts, so that
	// concurrent claims cannot interleave the batches.
	cfg := fastConfig(t, pool, h)
	cfg.Workers, cfg.BatchSize = 1, 2
	startWorker(t, cfg)
	require.Eventually(t, func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox WHERE status = 'processing'
			AND event_id IN ('a1-pay-o1', 'a2-create-o2')`) == 2
	}, 10*time.Second, 5*time.Millisecond)
	startWorker(t, cfg)

	waitAllDone(t, pool, 20*time.Second)
	require.EqualValues(t, 2, arrived.Load(), "both batches reached their releases together")
	for _, id := range []string{"a2-create-o2", "b2-create-o1"} {
		r := inboxRow(t, pool, id)
		require.Equal(t, row{Status: "processed", Attempts: 1}, r, "event %s", id)
	}
	for _, id := range []string{"a1-pay-o1", "b1-pay-o2"} {
		r := inboxRow(t, pool, id)
		require.Equal(t, "processed", r.Status, "event %s", id)
		require.Equal(t, 1, entries(t, pool, id))
	}
}

// releaseRace runs batch A [first, a-block] and batch B [second] on two
// workers: a-block holds A's transaction open until the test says so, and
// B's handler starts only once A's first event is done. It returns a function
// that lets A commit.
func releaseRace(t *testing.T, pool *pgxpool.Pool, first, second pgrelay.Incoming) (commitA func()) {
	receive(t, pool, first, blocker("a-block"), second)
	inOrder(t, pool, first.EventID, "a-block", second.EventID)
	blockStarted, started := onceChan()
	unblock, commitA := onceChan()
	t.Cleanup(commitA)
	h := pgrelay.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
		switch ev.EventID {
		case "a-block":
			started()
			select {
			case <-unblock:
			case <-ctx.Done():
			}
			return nil
		case second.EventID:
			select {
			case <-blockStarted:
			case <-time.After(5 * time.Second):
				t.Error("batch A never reached its blocking event")
			}
		}
		return ledger.Handler{}.Handle(ctx, tx, ev)
	})
	cfg := fastConfig(t, pool, h)
	cfg.Workers, cfg.BatchSize = 1, 2
	cfg.Lease, cfg.HandlerTimeout = 30*time.Second, 10*time.Second
	startWorker(t, cfg)
	// B starts once A holds its batch, so that claims cannot interleave.
	select {
	case <-blockStarted:
	case <-time.After(10 * time.Second):
		t.Fatal("batch A never reached its blocking event")
	}
	startWorker(t, cfg)
	return commitA
}

// TestReleaseDoesNotWaitForAnotherBatchsDeferral: batch A defers Paid(o1) and
// stays open; batch B's Created(o1) releases o1. The release must commit at
// once (it used to wait for A's advisory lock until A committed, past the
// handler timeout), and A's deferral, committed after the release, must still
// see it: the OrderPaid runs long before its one-minute fallback.
func TestReleaseDoesNotWaitForAnotherBatchsDeferral(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	commitA := releaseRace(t, pool, orderPaid("a-pay", "o1", 100), created("b-create", "o1"))

	r := waitStatus(t, pool, "b-create", "processed", 5*time.Second)
	require.Equal(t, 1, r.Attempts)
	require.Equal(t, "processing", inboxRow(t, pool, "a-pay").Status, "batch A is still open")

	commitA()
	r = waitStatus(t, pool, "a-pay", "processed", 10*time.Second)
	require.Equal(t, 1, r.Deferrals)
	require.Equal(t, 1, entries(t, pool, "a-pay"))
}

// TestDeferralDoesNotWaitForAnotherBatchsRelease: the other order. Batch A
// releases o1 (Created) and stays open; batch B's Paid(o1), which cannot see
// the uncommitted order, defers. The deferral must commit at once (it used to
// wait for A's advisory lock), and A's release, committed after the deferral,
// must still reach it.
func TestDeferralDoesNotWaitForAnotherBatchsRelease(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	commitA := releaseRace(t, pool, created("a-create", "o1"), orderPaid("b-pay", "o1", 100))

	require.Eventually(t, func() bool {
		r := inboxRow(t, pool, "b-pay")
		return r.Status == "pending" && r.Deferrals == 1
	}, 5*time.Second, 10*time.Millisecond, "the deferral committed while batch A is open")

	commitA()
	r := waitStatus(t, pool, "b-pay", "processed", 10*time.Second)
	require.Equal(t, 1, r.Deferrals)
	require.Equal(t, 1, entries(t, pool, "b-pay"))
}

// TestSweepCatchesAMissedRelease: a release whose check after commit never ran
// (its process died between the commit and the check) still reaches the
// deferred event within a poll interval or so, not at its one-minute fallback.
func TestSweepCatchesAMissedRelease(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	startWorker(t, fastConfig(t, pool, ledger.Handler{}))
	receive(t, pool, orderPaid("pay", "o1", 100))
	require.Eventually(t, func() bool { return inboxRow(t, pool, "pay").Deferrals == 1 },
		10*time.Second, 10*time.Millisecond)

	// What a committed Release leaves behind when nobody checks after it.
	createOrders(t, pool, "o1")
	_, err := pool.Exec(context.Background(), `INSERT INTO pgrelay.inbox_releases (waiting_for) VALUES ('order:o1')`)
	require.NoError(t, err)
	r := waitStatus(t, pool, "pay", "processed", 10*time.Second)
	require.Equal(t, 1, r.Deferrals)
}
