package pgrelay_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/inboxtest"
	"github.com/pgrelay/pgrelay/internal/ledger"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// TestTransientFailureThenSuccess fails the first attempt after the handler
// wrote its credit: the credit is rolled back with the attempt, the retry
// credits, and the event ends processed with attempts = 2.
func TestTransientFailureThenSuccess(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	createOrders(t, pool, "o1")
	receive(t, pool, orderPaid("pay-1", "o1", 700))

	var calls atomic.Int32
	h := pgrelay.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
		if err := (ledger.Handler{}).Handle(ctx, tx, ev); err != nil {
			return err
		}
		if calls.Add(1) == 1 {
			return errors.New("downstream hiccup")
		}
		return nil
	})
	stats := &inboxtest.CountingObserver{}
	cfg := fastConfig(t, pool, h)
	cfg.Observer = stats
	startWorker(t, cfg)

	r := waitStatus(t, pool, "pay-1", "processed", 10*time.Second)
	require.Equal(t, 2, r.Attempts)
	require.Equal(t, "downstream hiccup", r.LastError, "the last error is kept for the record")
	require.Equal(t, 1, entries(t, pool, "pay-1"))
	require.Equal(t, 1, stats.Snapshot().Retried)
}

// TestPoisonGoesDeadOthersFlow: an event whose handler always fails ends dead
// after MaxAttempts with the reason, while a steady stream of other events
// keeps being processed meanwhile.
func TestPoisonGoesDeadOthersFlow(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	createOrders(t, pool, "o1")
	receive(t, pool, orderPaid("poison", "o1", 1))

	h := pgrelay.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
		if ev.EventID == "poison" {
			return errors.New("cannot apply")
		}
		return ledger.Handler{}.Handle(ctx, tx, ev)
	})
	cfg := fastConfig(t, pool, h)
	cfg.MaxAttempts = 4
	cfg.BackoffMin, cfg.BackoffMax = 50*time.Millisecond, 100*time.Millisecond
	stats := &inboxtest.CountingObserver{}
	cfg.Observer = stats
	startWorker(t, cfg)

	// Feed other events while the poison is being retried; each must be
	// processed while the poison is still pending (not yet dead).
	processedWhilePoisonAlive := 0
	for i, id := range ids("ok", 200) {
		receive(t, pool, orderPaid(id, "o1", 1))
		if i%20 == 0 {
			waitStatus(t, pool, id, "processed", 5*time.Second)
			if inboxRow(t, pool, "poison").Status != "dead" {
				processedWhilePoisonAlive++
			}
		}
	}
	r := waitStatus(t, pool, "poison", "dead", 10*time.Second)
	require.Equal(t, 4, r.Attempts)
	require.Equal(t, "attempts exhausted: 4 of 4: cannot apply", r.LastError)
	reason, ok := stats.DeadReason("poison")
	require.True(t, ok)
	require.Equal(t, r.LastError, reason)
	require.Positive(t, processedWhilePoisonAlive)
	waitAllDone(t, pool, 10*time.Second)
	require.Equal(t, 200, queryInt(t, pool, `SELECT count(*) FROM ledger_entries`))
	require.Zero(t, entries(t, pool, "poison"))
}

// TestPermanentErrorAndPanic: a Permanent error is dead at the first attempt;
// a panicking handler is recovered, retried like a transient error, and the
// worker keeps processing other events.
func TestPermanentErrorAndPanic(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	createOrders(t, pool, "o1")
	receive(t, pool, orderPaid("panics", "o1", 1), orderPaid("perm", "o1", 1))

	h := pgrelay.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
		switch ev.EventID {
		case "panics":
			if ev.Attempts < 3 {
				panic("assignment to entry in nil map")
			}
		case "perm":
			return pgrelay.Permanent(errors.New("schema v9 is not supported"))
		}
		return ledger.Handler{}.Handle(ctx, tx, ev)
	})
	startWorker(t, fastConfig(t, pool, h))

	r := waitStatus(t, pool, "perm", "dead", 10*time.Second)
	require.Equal(t, 1, r.Attempts)
	require.Equal(t, "permanent: schema v9 is not supported", r.LastError)

	r = waitStatus(t, pool, "panics", "processed", 10*time.Second)
	require.Equal(t, 3, r.Attempts)
	require.Contains(t, r.LastError, "handler panicked: assignment to entry in nil map")
	require.Equal(t, 1, entries(t, pool, "panics"))

	// The worker is alive: a new event still gets processed.
	receive(t, pool, orderPaid("after", "o1", 1))
	waitStatus(t, pool, "after", "processed", 10*time.Second)
}

// TestHandlerTimeout: a handler stuck past HandlerTimeout (even inside a query)
// fails its attempt; its batch-mates are not charged an attempt and are
// processed, and the stuck event is retried.
func TestHandlerTimeout(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	createOrders(t, pool, "o1")
	receive(t, pool, orderPaid("a", "o1", 1), orderPaid("slow", "o1", 1), orderPaid("b", "o1", 1))

	h := pgrelay.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
		if ev.EventID == "slow" && ev.Attempts == 1 {
			if _, err := tx.Exec(ctx, "SELECT pg_sleep(30)"); err != nil {
				return err
			}
		}
		return ledger.Handler{}.Handle(ctx, tx, ev)
	})
	cfg := fastConfig(t, pool, h)
	cfg.Workers = 1
	cfg.HandlerTimeout = 300 * time.Millisecond
	startWorker(t, cfg)

	waitAllDone(t, pool, 15*time.Second)
	r := inboxRow(t, pool, "slow")
	require.Equal(t, "processed", r.Status)
	require.Equal(t, 2, r.Attempts)
	require.Contains(t, r.LastError, "handler timed out after 300ms")
	for _, id := range []string{"a", "b"} {
		require.Equal(t, 1, inboxRow(t, pool, id).Attempts, id)
		require.Equal(t, 1, entries(t, pool, id), id)
	}
}

// TestZombieWorkerIsFenced: worker A claims an event, writes its side effect
// and stalls past its lease; worker B takes the event over and starts its own
// attempt; A then finishes first and tries to mark the event processed. A is
// fenced by the lock_version: its side effect is rolled back and only B's
// commits.
func TestZombieWorkerIsFenced(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	// A side-effect table without a unique key: only fencing stops a second effect.
	_, err := pool.Exec(ctx, `CREATE TABLE effects (event_id text NOT NULL, worker text NOT NULL)`)
	require.NoError(t, err)
	receive(t, pool, orderPaid("e1", "o1", 1))

	aWrote := make(chan struct{})
	bStarted, closeBStarted := onceChan()
	aDone, closeADone := onceChan()
	effect := func(who string) pgrelay.HandlerFunc {
		return func(_ context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
			// The zombie ignores its context, as a stalled process would.
			_, err := tx.Exec(context.Background(), `INSERT INTO effects VALUES ($1, $2)`, ev.EventID, who)
			if err != nil {
				return err
			}
			switch who {
			case "A":
				close(aWrote)
				<-bStarted // stalled past the lease
			case "B":
				closeBStarted()
				<-aDone // A commits (or tries to) while B is still working
			}
			return nil
		}
	}
	statsA, statsB := &inboxtest.CountingObserver{}, &inboxtest.CountingObserver{}
	cfgA := fastConfig(t, pool, effect("A"))
	cfgA.WorkerID, cfgA.Workers, cfgA.Observer = "A", 1, statsA
	cfgA.Lease, cfgA.HandlerTimeout = 300*time.Millisecond, 200*time.Millisecond
	stopA := startWorker(t, cfgA)
	<-aWrote

	cfgB := fastConfig(t, pool, effect("B"))
	cfgB.WorkerID, cfgB.Workers, cfgB.Observer = "B", 1, statsB
	startWorker(t, cfgB)
	// Cleanups run last-in first-out: unblock the handlers before stopping
	// the workers, should the test fail half-way.
	t.Cleanup(func() { closeADone(); closeBStarted() })

	require.Eventually(t, func() bool { return statsA.Snapshot().Fenced == 1 }, 10*time.Second, 10*time.Millisecond)
	closeADone()
	stopA()
	waitStatus(t, pool, "e1", "processed", 10*time.Second)

	var workers []string
	rows, err := pool.Query(ctx, `SELECT worker FROM effects WHERE event_id = 'e1'`)
	require.NoError(t, err)
	workers, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"B"}, workers, "the zombie's side effect must have been rolled back")
	require.Zero(t, statsA.Snapshot().Processed)
	// The observer hears of the processed event after its commit: the row
	// can read processed a moment before.
	require.Eventually(t, func() bool { return statsB.Snapshot().Processed == 1 }, 5*time.Second, 5*time.Millisecond)
	require.Equal(t, 1, statsB.Snapshot().Takeovers)
	require.Equal(t, 2, inboxRow(t, pool, "e1").Attempts)
}

// TestGracefulShutdownHandsBackClaims: a worker stopped while its batch is
// stuck past ShutdownTimeout rolls the batch back and hands the claims back
// (pending, due now, attempt refunded), so another worker takes them at once
// instead of waiting for the lease.
func TestGracefulShutdownHandsBackClaims(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	createOrders(t, pool, "o1")
	receive(t, pool, orderPaid("e1", "o1", 1), orderPaid("e2", "o1", 1))

	started := make(chan struct{}, 10)
	release := make(chan struct{})
	h := pgrelay.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
		if err := (ledger.Handler{}).Handle(ctx, tx, ev); err != nil {
			return err
		}
		started <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return ctx.Err()
	})
	cfg := fastConfig(t, pool, h)
	cfg.Workers, cfg.Lease, cfg.HandlerTimeout = 1, time.Hour, 30*time.Minute
	cfg.ShutdownTimeout = 200 * time.Millisecond
	stop := startWorker(t, cfg)
	<-started
	stop()
	defer close(release)

	for _, id := range []string{"e1", "e2"} {
		r := inboxRow(t, pool, id)
		require.Equal(t, "pending", r.Status, id)
		require.Zero(t, r.Attempts, id)
	}
	require.Zero(t, queryInt(t, pool, `SELECT count(*) FROM ledger_entries`))
	// Due at once: another worker processes them without waiting an hour.
	startWorker(t, fastConfig(t, pool, ledger.Handler{}))
	waitAllDone(t, pool, 10*time.Second)
	require.Equal(t, 2, queryInt(t, pool, `SELECT count(*) FROM ledger_entries`))
}

// TestConfigValidation: bad settings fail NewWorker with an error naming the field.
func TestConfigValidation(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	base := fastConfig(t, pool, ledger.Handler{})
	for field, mutate := range map[string]func(*pgrelay.InboxConfig){
		"Config.Pool":           func(c *pgrelay.InboxConfig) { c.Pool = nil },
		"Config.Handler":        func(c *pgrelay.InboxConfig) { c.Handler = nil },
		"Config.Workers":        func(c *pgrelay.InboxConfig) { c.Workers = -1 },
		"Config.BatchSize":      func(c *pgrelay.InboxConfig) { c.BatchSize = pgrelay.MaxBatchSize + 1 },
		"Config.Lease":          func(c *pgrelay.InboxConfig) { c.Lease = -time.Second },
		"Config.HandlerTimeout": func(c *pgrelay.InboxConfig) { c.HandlerTimeout = time.Minute },
		"Config.MaxAttempts":    func(c *pgrelay.InboxConfig) { c.MaxAttempts = -3 },
		"Config.BackoffMax":     func(c *pgrelay.InboxConfig) { c.BackoffMin, c.BackoffMax = time.Second, time.Millisecond },
		"Config.MaxDeferrals":   func(c *pgrelay.InboxConfig) { c.MaxDeferrals = -1 },
		"Config.PollInterval":   func(c *pgrelay.InboxConfig) { c.PollInterval = -1 },
	} {
		cfg := base
		mutate(&cfg)
		_, err := pgrelay.NewInboxWorker(cfg)
		require.Error(t, err, field)
		require.True(t, strings.Contains(err.Error(), field), "%s: %v", field, err)
	}
	w, err := pgrelay.NewInboxWorker(pgrelay.InboxConfig{Pool: pool, Handler: ledger.Handler{}})
	require.NoError(t, err, "defaults are valid")
	require.NotNil(t, w)
}

// TestGracefulStopCommitsDoneWork: stopping a worker mid-batch lets the
// handler in flight finish, commits the events done, starts no new handler,
// and hands the rest back with their attempts refunded.
func TestGracefulStopCommitsDoneWork(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	createOrders(t, pool, "o1")
	for _, id := range ids("e", 6) {
		receive(t, pool, orderPaid(id, "o1", 1)) // one by one: claim order = receive order
	}
	inThird, stopping := make(chan struct{}), make(chan struct{})
	h := pgrelay.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
		if ev.EventID == "e-00002" {
			close(inThird)
			<-stopping
		}
		return ledger.Handler{}.Handle(ctx, tx, ev)
	})
	cfg := fastConfig(t, pool, h)
	cfg.Workers, cfg.BatchSize = 1, 10
	w, err := pgrelay.NewInboxWorker(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	<-inThird
	cancel()
	close(stopping)
	require.NoError(t, <-done)

	for i, id := range ids("e", 6) {
		r := inboxRow(t, pool, id)
		if i <= 2 {
			require.Equal(t, "processed", r.Status, id)
			require.Equal(t, 1, entries(t, pool, id), id)
		} else {
			require.Equal(t, "pending", r.Status, id)
			require.Zero(t, r.Attempts, id)
			require.Zero(t, entries(t, pool, id), id)
		}
	}
}

// TestLongBatchStopsAtHalfLease: a batch whose handlers are slow stops
// starting new handlers once half the lease has passed and hands the rest
// back, so no claim expires under it and no work is fenced and wasted.
func TestLongBatchStopsAtHalfLease(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	createOrders(t, pool, "o1")
	var msgs []pgrelay.Incoming
	for _, id := range ids("e", 8) {
		msgs = append(msgs, orderPaid(id, "o1", 1))
	}
	receive(t, pool, msgs...)
	h := pgrelay.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
		time.Sleep(300 * time.Millisecond) // slow work, not a wait for the test
		return ledger.Handler{}.Handle(ctx, tx, ev)
	})
	stats := &inboxtest.CountingObserver{}
	cfg := fastConfig(t, pool, h)
	cfg.Workers, cfg.BatchSize, cfg.Lease, cfg.HandlerTimeout, cfg.Observer = 2, 8, 2*time.Second, time.Second, stats
	startWorker(t, cfg)
	waitAllDone(t, pool, 20*time.Second)
	require.Zero(t, stats.Snapshot().Fenced)
	require.Zero(t, stats.Snapshot().Takeovers)
	require.Equal(t, 8, queryInt(t, pool, `SELECT count(*) FROM ledger_entries`))
	require.Equal(t, 8, queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox WHERE attempts = 1`))
}

// receiveNotify stores msgs and notifies the workers in one transaction, as a
// process whose workers run elsewhere does.
func receiveNotify(t *testing.T, pool *pgxpool.Pool, msgs ...pgrelay.Incoming) {
	t.Helper()
	require.NoError(t, pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		if _, err := pgrelay.Receive(context.Background(), tx, msgs); err != nil {
			return err
		}
		return pgrelay.NotifyInbox(context.Background(), tx)
	}))
}

// TestWakeByNotification: with polling effectively off, events stored with
// Notify still reach the worker at once through LISTEN/NOTIFY, also after the
// listening connection was killed (the listener reconnects), and a Release
// wakes the deferred event it releases.
func TestWakeByNotification(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	cfg := fastConfig(t, pool, ledger.Handler{})
	cfg.PollInterval = time.Hour
	startWorker(t, cfg)

	createOrders(t, pool, "o1")
	receiveNotify(t, pool, orderPaid("e1", "o1", 1))
	waitStatus(t, pool, "e1", "processed", 10*time.Second)

	// Kill the listener's connection; the worker must listen again.
	listener := `SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query = 'LISTEN pgrelay_inbox'`
	require.Eventually(t, func() bool { return queryInt(t, pool, `SELECT count(*) FROM (`+listener+`) l`) == 1 },
		10*time.Second, 10*time.Millisecond)
	_, err := pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM (`+listener+`) l`)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND query = 'LISTEN pgrelay_inbox' AND backend_start > now() - interval '1 minute' AND state = 'idle'`) == 1
	}, 10*time.Second, 10*time.Millisecond, "the listener never reconnected")
	receiveNotify(t, pool, orderPaid("e2", "o2", 1)) // its order does not exist yet: deferred
	require.Eventually(t, func() bool { return inboxRow(t, pool, "e2").Deferrals == 1 }, 10*time.Second, 10*time.Millisecond)
	receiveNotify(t, pool, pgrelay.Incoming{Message: orderCreatedMessage("c2", "o2")})
	r := waitStatus(t, pool, "e2", "processed", 10*time.Second)
	require.Equal(t, 1, r.Attempts)
}

// TestWakeInProcess: with polling effectively off and nothing notified, a
// Wake after the store committed reaches the worker at once (the consumer
// does this after each batch it stores).
func TestWakeInProcess(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	cfg := fastConfig(t, pool, ledger.Handler{})
	cfg.PollInterval = time.Hour
	w, err := pgrelay.NewInboxWorker(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	createOrders(t, pool, "o1")
	// Once the listener is up (it wakes everyone when it connects), the
	// goroutines' claims find nothing and they wait for an hour.
	require.Eventually(t, func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND query = 'LISTEN pgrelay_inbox' AND state = 'idle'`) == 1
	}, 10*time.Second, 10*time.Millisecond)
	time.Sleep(100 * time.Millisecond)
	receive(t, pool, orderPaid("e1", "o1", 1))
	w.Wake()
	waitStatus(t, pool, "e1", "processed", 5*time.Second)
}

// TestWorkerPrunesOldReleases: Release records older than the retention are
// deleted by the worker; recent ones stay.
func TestWorkerPrunesOldReleases(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	_, err := pool.Exec(context.Background(), `INSERT INTO pgrelay.inbox_releases (waiting_for, released_at)
		SELECT 'old:' || g, now() - interval '11 minutes' FROM generate_series(1, 2500) g
		UNION ALL SELECT 'recent', now() - interval '1 minute'`)
	require.NoError(t, err)
	startWorker(t, fastConfig(t, pool, ledger.Handler{}))
	require.Eventually(t, func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox_releases WHERE waiting_for LIKE 'old:%'`) == 0
	}, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, 1, queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox_releases`))
}
