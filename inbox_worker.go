package pgrelay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/internal/db"
	"github.com/pgrelay/pgrelay/internal/maintenance"
	"github.com/pgrelay/pgrelay/internal/notifier"
	"github.com/pgrelay/pgrelay/internal/wait"
)

// InboxWorker claims due inbox events and runs the handler on them, each event's
// side effect committing with its processed mark. Several workers, in one
// process or many, share the inbox safely.
type InboxWorker struct {
	cfg     InboxConfig
	q       *db.Queries
	log     *slog.Logger
	wake    *waker
	running atomic.Bool

	// notifier wakes the goroutines when another process stored events.
	notifier *notifier.Notifier
	// cleaner is the inbox's upkeep; nil when InboxConfig.Retention.Disabled.
	cleaner *InboxCleaner
	// floor is where the claims start their scan (see claimFloor).
	floor claimFloor
}

// claimFloor keeps the claims of a worker from walking the pending index's
// entries of rows it has already claimed. A claim leaves a dead entry in
// inbox_pending_idx, at the front of the index (and so does every event the
// consumer applies on receive), and while any transaction holds the xmin
// horizon nothing removes them: neither vacuum nor the index scans' own
// cleanup. A claim that scans from the start walks every one of them, and
// visits its heap tuple, so with a horizon held for minutes each claim took
// longer than the last, the workers fell behind, the consumer stopped
// applying on receive, and the claims carried everything.
//
// A claim takes the lowest next_attempt_at first. So once it returned rows up
// to T, every due row below T that its snapshot saw was claimed (by it, or by
// a claim holding the row locked); and once it returned less than a batch,
// every due row its snapshot saw was. A row can only become pending below
// that later by committing late: an insert or an update whose
// next_attempt_at is its transaction's start (a store, a release, an
// unclaim), or an update that locked the row and rolled back. The bound is
// therefore the greatest of T and the drained claim's start, less a margin
// that covers such transactions; the drained claim's start is kept on this
// process's monotonic clock and sent as an age (now() - since), so no clock
// is compared with the server's. A claim from the start (no bound) runs at
// least every fullEvery, or every 20 times as long as the last one took, at
// most every maxEvery, for the rare row later than the margin. A batch in
// flight holds the bound where it was when the batch began (hold), so its
// retries, deferrals and hand-backs, stamped with its transaction's start,
// are above the bound however long it runs; so does the consumer's store
// (HoldClaimBound).
type claimFloor struct {
	mu       sync.Mutex
	at       time.Time // the greatest next_attempt_at claimed (server clock); zero: none
	drained  time.Time // when the latest claim that returned less than a batch began (local clock); zero: none
	lastFull time.Time // when the last claim from the start began; zero: none yet
	every    time.Duration
	// holds are the batches in flight (see hold); nextHold numbers them.
	holds    map[uint64]floorHold
	nextHold uint64
	// margin, fullEvery and maxEvery are the settings above (tests change
	// them).
	margin, fullEvery, maxEvery time.Duration
}

// floorHold keeps the bound at or below where it was when a batch of this
// worker began: the batch's retries, deferrals and hand-backs get its
// transaction's start as next_attempt_at (plus their delay), which the
// bound must not pass before they commit, however long the batch takes.
//
// A hold outlives its release until a claim that began after the release has
// returned: that claim saw what the batch committed, so the bound that
// follows from it is below whatever of it is still pending.
type floorHold struct {
	at, start, until time.Time
	released         time.Time // zero: not yet
}

const (
	floorMargin    = 500 * time.Millisecond
	floorFullEvery = 5 * time.Second
	floorMaxEvery  = time.Minute
)

// claimBound is where a claim starts: next_attempt_at at least notBefore
// and at least now() - since (nil and not valid: from the start).
type claimBound struct {
	notBefore *time.Time
	since     pgtype.Interval
	full      bool
}

// bound returns where a claim beginning at now starts its scan.
func (f *claimFloor) bound(now time.Time) claimBound {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.margin == 0 {
		f.margin, f.fullEvery, f.maxEvery = floorMargin, floorFullEvery, floorMaxEvery
	}
	if f.lastFull.IsZero() || now.Sub(f.lastFull) >= max(f.every, f.fullEvery) {
		f.lastFull = now
		return claimBound{full: true}
	}
	at, drained := f.at, f.drained
	for id, h := range f.holds {
		if now.After(h.until) {
			delete(f.holds, id) // never released (a rolled-back store): long over
			continue
		}
		if h.at.Before(at) {
			at = h.at
		}
		if h.start.Before(drained) {
			drained = h.start
		}
	}
	var b claimBound
	if !at.IsZero() {
		at = at.Add(-f.margin)
		b.notBefore = &at
	}
	if !drained.IsZero() {
		b.since = interval(now.Sub(drained) + f.margin)
	}
	return b
}

// hold keeps the bound where it is now until release is called, or at most
// for d.
func (f *claimFloor) hold(now time.Time, d time.Duration) (release func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.holds == nil {
		f.holds = make(map[uint64]floorHold)
	}
	f.nextHold++
	id := f.nextHold
	f.holds[id] = floorHold{at: f.at, start: now, until: now.Add(d)}
	return func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		if h, ok := f.holds[id]; ok {
			h.released = time.Now()
			f.holds[id] = h
		}
	}
}

// claimed records a claim that began at start and returned n of a batch of
// size rows, the greatest next_attempt_at among them, and how long it took.
func (f *claimFloor) claimed(b claimBound, start time.Time, n, size int, greatest time.Time, took time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if b.full {
		f.every = min(20*took, f.maxEvery)
	}
	for id, h := range f.holds {
		if !h.released.IsZero() && start.After(h.released) {
			delete(f.holds, id)
		}
	}
	if greatest.After(f.at) {
		f.at = greatest
	}
	if n < size && start.After(f.drained) {
		f.drained = start
	}
}

// HoldClaimBound keeps the claims of this worker from starting their scan
// past rows a transaction is storing now (their next_attempt_at is its
// start) until release is called, after it ended: the consumer holds it
// around each store. Without it, such a row committing more than half a
// second after its transaction began waits for the next claim from the
// start (a few seconds).
func (w *InboxWorker) HoldClaimBound() (release func()) {
	return w.floor.hold(time.Now(), w.cfg.Lease)
}

// NewInboxWorker returns a worker that processes the inbox with cfg.Handler
// once Run is called. It fails if cfg is invalid, naming the InboxConfig
// field.
func NewInboxWorker(cfg InboxConfig) (*InboxWorker, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	w := &InboxWorker{
		cfg:  cfg,
		q:    db.New(),
		log:  loggerOr(cfg.Logger).With(slog.String("logger", "inbox")).With(slog.String("worker_id", cfg.WorkerID), slog.String("handler", cfg.HandlerName)),
		wake: newWaker(),
	}
	if cfg.NoListen {
		if err := w.newCleaner(); err != nil {
			return nil, err
		}
		return w, nil
	}
	n, err := notifier.New(notifier.Config{
		Pool:         cfg.Pool,
		ConnConfig:   cfg.ListenConnConfig,
		Topics:       []notifier.Topic{{Channel: notifier.InboxChannel, Notify: func(string) { w.wake.broadcast() }}},
		OnListen:     w.wake.broadcast, // anything stored while not listening is picked up now
		QueryTimeout: cfg.QueryTimeout,
		Logger:       w.log,
	})
	if err != nil {
		return nil, fmt.Errorf("inbox: %w", err)
	}
	w.notifier = n
	if err := w.newCleaner(); err != nil {
		return nil, err
	}
	return w, nil
}

// newCleaner sets up the inbox's upkeep unless InboxConfig.Retention.Disabled.
func (w *InboxWorker) newCleaner() (err error) {
	if !w.cfg.Retention.Disabled {
		w.cleaner, err = newCleaner(w.cfg.Pool, w.cfg.Retention, w.log)
	}
	return err
}

// Run processes events until ctx is cancelled, then stops gracefully: batches
// in flight finish within InboxConfig.ShutdownTimeout or are rolled back and
// their claims handed back. Beside the workers it runs the inbox's upkeep
// (InboxConfig.Retention, unless Disabled) and its LISTEN connection. It
// returns nil after a graceful stop.
func (w *InboxWorker) Run(ctx context.Context) error {
	if !w.running.CompareAndSwap(false, true) {
		return errors.New("inbox: worker is already running")
	}
	defer w.running.Store(false)
	w.log.Info("inbox worker starting", slog.Int("workers", w.cfg.Workers), slog.Int("batch_size", w.cfg.BatchSize))
	var wg sync.WaitGroup
	if w.notifier != nil {
		wg.Go(func() { w.notifier.Run(ctx) })
	}
	if w.cleaner != nil {
		wg.Go(func() { _ = w.cleaner.Run(ctx) })
	}
	stats := maintenance.Statistics{Pool: w.cfg.Pool, Table: "inbox", Interval: w.cfg.StatisticsInterval, Logger: w.log}
	wg.Go(func() { stats.Run(ctx) })
	wg.Go(func() { w.sweepReleased(ctx) })
	if w.cfg.Ordered {
		wg.Go(func() { w.scanOrdered(ctx) })
	}
	for range w.cfg.Workers {
		wg.Go(func() { w.loop(ctx) })
	}
	wg.Wait()
	w.log.Info("inbox worker stopped")
	return nil
}

// loop is one worker goroutine: claim and process until ctx is done, waiting
// for a notification or the jittered poll when there is nothing to do.
func (w *InboxWorker) loop(ctx context.Context) {
	var lostChecked time.Time
	tookOver := false
	for ctx.Err() == nil {
		// Taken before the claim, so that a notification arriving while the
		// batch runs is not lost: it closes this channel.
		wake := w.wake.channel()
		// Expired leases are rare: looked for at most once per poll
		// interval, not before every batch of a busy worker, except right
		// after a takeover (the rest of a crashed batch follows).
		checkLost := tookOver || time.Since(lostChecked) >= w.cfg.PollInterval
		if checkLost {
			lostChecked = time.Now()
		}
		var full bool
		var err error
		full, tookOver, err = w.runOnce(ctx, checkLost)
		if err != nil && ctx.Err() == nil {
			w.log.Warn("inbox batch failed", slog.Any("error", err))
		}
		if full && err == nil {
			continue
		}
		t := time.NewTimer(wait.Jitter(w.cfg.PollInterval, jitterSpread))
		select {
		case <-ctx.Done():
		case <-wake:
		case <-t.C:
		}
		t.Stop()
	}
}

// runOnce takes over, when checkLost is set, at most one event whose worker was
// lost and processes it alone (if it killed its last worker, it is the
// likeliest culprit, and alone it cannot take others down with it again), then
// claims and processes one batch of pending events. It reports whether there
// may be more to do at once, and whether it took an event over.
func (w *InboxWorker) runOnce(ctx context.Context, checkLost bool) (full, tookOver bool, err error) {
	var lost []*InboxEvent
	if checkLost {
		if lost, err = w.claimLost(ctx); err != nil {
			return false, false, err
		}
	}
	if len(lost) > 0 {
		release := w.floor.hold(time.Now(), w.cfg.Lease)
		err := w.processBatch(ctx, lost)
		release()
		if err != nil {
			return false, true, err
		}
	}
	batch, err := w.claim(ctx)
	if err != nil {
		return false, len(lost) > 0, err
	}
	if len(batch) == 0 {
		return len(lost) > 0, len(lost) > 0, nil
	}
	defer w.floor.hold(time.Now(), w.cfg.Lease)()
	return len(batch) == w.cfg.BatchSize || len(lost) > 0, len(lost) > 0, w.processBatch(ctx, batch)
}

func interval(d time.Duration) pgtype.Interval {
	return pgtype.Interval{Microseconds: d.Microseconds(), Valid: true}
}

// claim claims a batch of due pending events, in its own committed statement.
func (w *InboxWorker) claim(ctx context.Context) ([]*InboxEvent, error) {
	// Not cancelled with ctx: a claim the server committed while the client
	// gave up would hold its rows until the lease expired. Claimed events
	// are handed back at once when the worker is stopping (processBatch).
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.QueryTimeout)
	defer cancel()
	if w.cfg.Ordered {
		rows, err := w.q.ClaimInboxOrdered(qctx, w.cfg.Pool, db.ClaimInboxOrderedParams{
			Handler: w.cfg.HandlerName, MaxAttempts: int32(w.cfg.MaxAttempts), WorkerID: w.cfg.WorkerID,
			Lease: interval(w.cfg.Lease), BatchSize: int32(w.cfg.BatchSize),
		})
		if err != nil {
			return nil, fmt.Errorf("inbox: claim: %w", err)
		}
		cs := make([]claimed, len(rows))
		for i, r := range rows {
			cs[i] = fromOrderedRow(r)
		}
		return w.claimedEvents(cs, false), nil
	}
	start := time.Now()
	bound := w.floor.bound(start)
	rows, err := w.q.ClaimInbox(qctx, w.cfg.Pool, db.ClaimInboxParams{
		Handler: w.cfg.HandlerName, MaxAttempts: int32(w.cfg.MaxAttempts), WorkerID: w.cfg.WorkerID,
		Lease: interval(w.cfg.Lease), BatchSize: int32(w.cfg.BatchSize), NotBefore: bound.notBefore, Since: bound.since,
	})
	if err != nil {
		return nil, fmt.Errorf("inbox: claim: %w", err)
	}
	cs := make([]claimed, len(rows))
	var greatest time.Time
	for i, r := range rows {
		cs[i] = fromClaimRow(r)
		if r.NextAttemptAt.After(greatest) {
			greatest = r.NextAttemptAt
		}
	}
	w.floor.claimed(bound, start, len(rows), w.cfg.BatchSize, greatest, time.Since(start))
	return w.claimedEvents(cs, false), nil
}

// claimLost takes over one event whose lease expired.
func (w *InboxWorker) claimLost(ctx context.Context) ([]*InboxEvent, error) {
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.QueryTimeout)
	defer cancel()
	rows, err := w.q.ClaimInboxLost(qctx, w.cfg.Pool, db.ClaimInboxLostParams{
		Handler: w.cfg.HandlerName, MaxAttempts: int32(w.cfg.MaxAttempts), WorkerID: w.cfg.WorkerID,
		Lease: interval(w.cfg.Lease), BatchSize: 1,
	})
	if err != nil {
		return nil, fmt.Errorf("inbox: claim lost events: %w", err)
	}
	cs := make([]claimed, len(rows))
	for i, r := range rows {
		cs[i] = fromLostRow(r)
	}
	return w.claimedEvents(cs, true), nil
}

// claimedEvents reports a claim and returns the events to process; events the
// claim moved to dead (attempts exhausted) are reported and left out.
func (w *InboxWorker) claimedEvents(cs []claimed, takeover bool) []*InboxEvent {
	if len(cs) == 0 {
		return nil
	}
	// RETURNING follows no order: run the batch in arrival order, so that
	// events are handled first come, first served.
	slices.SortStableFunc(cs, func(a, b claimed) int { return arrivalOrder(&a.ev, &b.ev) })
	evs := make([]*InboxEvent, 0, len(cs))
	for i := range cs {
		ev := &cs[i].ev
		if cs[i].status == "dead" {
			w.log.Warn("inbox event dead", slog.String("event_id", ev.EventID), slog.String("reason", ev.LastError))
			w.cfg.Observer.Dead(ev, ev.LastError)
			if w.cfg.Ordered && ev.KeySeq > 0 {
				w.sequence(SeqParked, 1)
			}
			continue
		}
		if takeover {
			w.log.Info("inbox event taken over from a lost worker",
				slog.String("event_id", ev.EventID), slog.Int("attempt", ev.Attempts))
		}
		evs = append(evs, ev)
	}
	takeovers := 0
	if takeover {
		takeovers = len(cs)
	}
	w.cfg.Observer.Claimed(len(cs), takeovers)
	if w.cfg.Ordered {
		orderRun(evs)
	}
	return evs
}

// arrivalOrder orders events first come, first served: by the time the inbox
// stored them, then by dedup key.
func arrivalOrder(a, b *InboxEvent) int {
	if c := a.ReceivedAt.Compare(b.ReceivedAt); c != 0 {
		return c
	}
	return strings.Compare(a.DedupKey, b.DedupKey)
}

// result is what happened to one event of a batch, reported once the batch
// transaction committed.
type result struct {
	ev        *InboxEvent
	fenced    bool
	processed bool
	dur       time.Duration
	d         decision
	// absorbed (ordered mode) is a duplicate sequence closed without running
	// the handler.
	absorbed bool
}

// errBatchBroken means the batch transaction can no longer be used; culprit
// is the event whose handler broke it, if known.
type errBatchBroken struct {
	err     error
	culprit *InboxEvent
	cause   error // the culprit's handler error
}

func (e *errBatchBroken) Error() string { return "inbox: batch transaction broken: " + e.err.Error() }
func (e *errBatchBroken) Unwrap() error { return e.err }

// processBatch runs the events of one claim in one transaction, a savepoint
// each (for an ExternalHandler, one transaction each: runEach). It starts no
// new handler once ctx is cancelled (graceful stop) or half the lease has
// gone (so that the claims do not expire under it): it commits what is done
// and hands the rest back. Cancelling ctx leaves the handler in flight
// InboxConfig.ShutdownTimeout to finish; after that the batch is rolled back and
// every claim handed back.
func (w *InboxWorker) processBatch(ctx context.Context, evs []*InboxEvent) error {
	if len(evs) == 0 {
		return nil
	}
	leaseHalf := time.Now().Add(w.cfg.Lease / 2)
	stopEarly := func() bool { return ctx.Err() != nil || time.Now().After(leaseHalf) }
	pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stop := context.AfterFunc(ctx, func() {
		t := time.NewTimer(w.cfg.ShutdownTimeout)
		defer t.Stop()
		select {
		case <-t.C:
			cancel()
		case <-pctx.Done():
		}
	})
	defer stop()

	released := &releaseSet{}
	var results []result
	var rest []*InboxEvent
	var err error
	if external(w.cfg.Handler) {
		// One transaction per event: what committed stays committed when a
		// later event's transaction fails.
		var failed *InboxEvent
		if results, rest, failed, err = w.runEach(withReleaseSet(pctx, released), evs, stopEarly); err != nil {
			w.recover([]*InboxEvent{failed}, err, pctx.Err() != nil)
		}
	} else if results, rest, err = w.runBatch(withReleaseSet(pctx, released), evs, stopEarly); err != nil {
		// pctx ends only when the shutdown timeout ran out: then every claim is
		// handed back, whatever failed first.
		w.recover(evs, err, pctx.Err() != nil)
		return err
	}
	keys := released.taken()
	woke := len(keys) > 0
	for _, r := range results {
		w.report(r)
		if !r.fenced && !r.processed && r.d.outcome == outcomeDefer {
			keys = append(keys, r.d.waitingFor)
		}
	}
	w.wakeReleased(ctx, keys, woke)
	if len(rest) > 0 {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.QueryTimeout)
		defer cancel()
		w.unclaim(uctx, rest)
	}
	return err
}

// runBatch processes evs until stopEarly says so, and returns the outcomes and
// the events it did not start. It first runs the batch optimistically (see
// runOptimistic); when that does not commit, the batch is run again with each
// event isolated in a savepoint (runIsolated).
func (w *InboxWorker) runBatch(ctx context.Context, evs []*InboxEvent, stopEarly func() bool) (results []result, rest []*InboxEvent, err error) {
	results, rest, known, done, err := w.runOptimistic(ctx, evs, stopEarly)
	if done {
		return results, rest, err
	}
	return w.runIsolated(ctx, evs, stopEarly, known)
}

// runOptimistic runs the batch in one transaction without savepoints: the
// handlers (one HandleBatch call when the handler is a InboxBatchHandler), then one
// fenced statement marking every event processed, then the commit (sent with
// the mark in one round trip, except in ordered mode: markAndCommit). It reports
// done=false, with the transaction rolled back, when a handler failed or the
// mark did not match every event (one was taken over, or a handler swallowed
// an error that aborted the transaction); known then holds the failures that
// are certain to be the event's own, so that the isolated run records them
// without calling that handler a second time in the same attempt.
func (w *InboxWorker) runOptimistic(ctx context.Context, evs []*InboxEvent, stopEarly func() bool) (
	results []result, rest []*InboxEvent, known map[*InboxEvent]error, done bool, err error) {
	// On a connection of its own rather than pool.Begin: the commit may go
	// with the mark in one round trip (markAndCommit), past pgx's Tx, which
	// is then left as it is; endBatch rolls back whatever is still open.
	bctx, cancel := context.WithTimeout(ctx, w.cfg.QueryTimeout)
	conn, err := w.cfg.Pool.Acquire(bctx)
	if err != nil {
		cancel()
		// Nothing ran: the claims are handed back by recover.
		return nil, nil, nil, true, fmt.Errorf("inbox: begin batch: %w", err)
	}
	defer w.endBatch(ctx, conn)
	tx, err := conn.Begin(bctx)
	cancel()
	if err != nil {
		return nil, nil, nil, true, fmt.Errorf("inbox: begin batch: %w", err)
	}

	var g gated
	if w.cfg.Ordered {
		if g, err = w.gate(ctx, tx, evs); err != nil {
			return nil, nil, nil, true, err
		}
		evs = g.run
	}
	ran := evs
	durs := make([]time.Duration, len(evs))
	if bh, ok := w.cfg.Handler.(InboxBatchHandler); ok && len(evs) > 1 {
		if exp := expiredEvents(evs, time.Now()); exp != nil {
			// The isolated run records the expired events dead and runs
			// the others one by one.
			return nil, nil, exp, false, nil
		}
		if stopEarly() {
			// Nothing commits: the duplicates the gate closed are handed
			// back too (absorbed again by the next claim).
			for _, r := range g.absorbed {
				evs = append(evs, r.ev)
			}
			return nil, evs, nil, true, nil
		}
		start := time.Now()
		if herr := w.callBatchHandler(ctx, tx, bh, evs); herr != nil {
			w.log.Debug("inbox batch handler failed; running the batch event by event",
				slog.Int("events", len(evs)), slog.Any("error", herr))
			return nil, nil, nil, false, nil
		}
		per := time.Since(start) / time.Duration(len(evs))
		for i := range durs {
			durs[i] = per
		}
	} else {
		for i, ev := range evs {
			if stopEarly() {
				ran, rest = evs[:i], evs[i:]
				break
			}
			start := time.Now()
			herr := w.callHandler(ctx, tx, ev)
			durs[i] = time.Since(start)
			if herr != nil {
				if inFailedTransaction(herr) {
					// An earlier handler swallowed the error that aborted
					// the transaction: the isolated run finds which.
					return nil, nil, nil, false, nil
				}
				return nil, nil, map[*InboxEvent]error{ev: herr}, false, nil
			}
		}
	}
	if len(ran) == 0 && len(g.absorbed) == 0 {
		return nil, rest, nil, true, nil
	}
	if !w.cfg.Ordered {
		return w.markAndCommit(ctx, tx, ran, durs, rest)
	}
	// Ordered mode: the mark returns the keys it matched, and the keys'
	// sequences advance after it, in statements of their own before the
	// commit.
	p := db.MarkInboxBatchProcessedParams{
		Handler: w.cfg.HandlerName, DedupKeys: make([]string, len(ran)), LockVersions: make([]int64, len(ran)),
	}
	for i, ev := range ran {
		p.DedupKeys[i], p.LockVersions[i] = ev.DedupKey, ev.LockVersion
	}
	marked, err := w.markBatch(ctx, tx, p)
	if err != nil {
		// Aborted by a handler that swallowed an error: the isolated run
		// tells which event, and keeps the others' work.
		return nil, nil, nil, false, nil
	}
	if len(marked) != len(ran) {
		// Another worker took events over: roll back (their effects here
		// must not commit) and run the others again, isolated.
		ok := make(map[string]bool, len(marked))
		for _, key := range marked {
			ok[key] = true
		}
		known = make(map[*InboxEvent]error)
		for _, ev := range ran {
			if !ok[ev.DedupKey] {
				known[ev] = errFenced
			}
		}
		return nil, nil, known, false, nil
	}
	var woke int64
	if w.cfg.Ordered {
		if woke, err = w.advance(ctx, tx, ran); err != nil {
			// The isolated run tries again, and reports a lasting failure.
			return nil, nil, nil, false, nil
		}
	}
	cctx, cancel := context.WithTimeout(ctx, w.cfg.QueryTimeout)
	defer cancel()
	if err := tx.Commit(cctx); err != nil {
		return nil, nil, nil, true, &errBatchBroken{err: fmt.Errorf("commit: %w", err)}
	}
	if woke > 0 {
		w.wake.broadcast()
	}
	results = make([]result, len(ran), len(ran)+len(g.absorbed))
	for i, ev := range ran {
		results[i] = result{ev: ev, processed: true, dur: durs[i]}
	}
	return append(results, g.absorbed...), rest, nil, true, nil
}

// markAndCommit marks the events of an optimistic batch processed and
// commits, in one round trip: MarkInboxBatchProcessedAll and COMMIT in one
// pgx batch, which the server runs up to the first error, skipping the rest
// up to the batch's single Sync. The mark fails when it matches fewer rows
// than it was given (an event was taken over by another worker), so the
// COMMIT never runs after a fenced mark: the transaction is left aborted,
// endBatch rolls it back, and the batch runs again isolated
// (done=false), where each event's own fenced mark finds the events taken
// over. pgx's Tx is bypassed (its Commit would send a statement of its own)
// and never used again. Not for ordered mode, whose keys advance between the
// mark and the commit.
func (w *InboxWorker) markAndCommit(ctx context.Context, tx pgx.Tx, ran []*InboxEvent, durs []time.Duration, rest []*InboxEvent) (
	results []result, _ []*InboxEvent, known map[*InboxEvent]error, done bool, err error) {
	conn := tx.Conn()
	if conn.PgConn().TxStatus() != 'T' {
		// A handler swallowed the error of a statement that aborted the
		// transaction, or ended it (known from the last reply, without a
		// round trip): the isolated run finds which. Outside a transaction
		// the mark would commit on its own.
		return nil, nil, nil, false, nil
	}
	p := db.MarkInboxBatchProcessedAllParams{
		Handler: w.cfg.HandlerName, DedupKeys: make([]string, len(ran)), LockVersions: make([]int64, len(ran)),
	}
	for i, ev := range ran {
		p.DedupKeys[i], p.LockVersions[i] = ev.DedupKey, ev.LockVersion
	}
	cctx, cancel := context.WithTimeout(ctx, w.cfg.QueryTimeout)
	defer cancel()
	err = w.q.MarkInboxBatchProcessedAll(cctx, commitAfter{conn: conn}, p)
	var markErr *errMarkBeforeCommit
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &markErr) && (errors.As(err, &pgErr) || pgconn.SafeToRetry(err)):
		// The server refused the mark, so it skipped the COMMIT (or
		// nothing was sent: a handler left the connection busy): events
		// were taken over. Which ones is read after the rollback, so that
		// the isolated run records them fenced instead of running their
		// handlers again (a rare path: two more round trips).
		w.log.Debug("inbox batch mark failed; running the batch event by event",
			slog.Int("events", len(ran)), slog.Any("error", err))
		return nil, nil, w.takenOver(ctx, conn, ran, p), false, nil
	case err != nil:
		// The commit failed, or its outcome is unknown (the connection
		// broke): as a failed commit.
		return nil, nil, nil, true, &errBatchBroken{err: fmt.Errorf("commit: %w", err)}
	}
	results = make([]result, len(ran))
	for i, ev := range ran {
		results[i] = result{ev: ev, processed: true, dur: durs[i]}
	}
	return results, rest, nil, true, nil
}

// takenOver rolls back the aborted batch transaction on conn and returns,
// as errFenced, the events of ran no longer claimed under their
// lock_version. On a failure it returns nil: the isolated run's fenced marks
// find them anyway, after running their handlers again.
func (w *InboxWorker) takenOver(ctx context.Context, conn *pgx.Conn, ran []*InboxEvent, p db.MarkInboxBatchProcessedAllParams) map[*InboxEvent]error {
	qctx, cancel := context.WithTimeout(ctx, w.cfg.QueryTimeout)
	defer cancel()
	if _, err := conn.Exec(qctx, "rollback"); err != nil {
		return nil
	}
	claimed, err := w.q.InboxStillClaimed(qctx, conn, db.InboxStillClaimedParams{
		DedupKeys: p.DedupKeys, LockVersions: p.LockVersions, Handler: p.Handler,
	})
	if err != nil {
		return nil
	}
	ok := make(map[string]bool, len(claimed))
	for _, key := range claimed {
		ok[key] = true
	}
	known := make(map[*InboxEvent]error)
	for _, ev := range ran {
		if !ok[ev.DedupKey] {
			known[ev] = errFenced
		}
	}
	return known
}

// commitAfter runs a statement and COMMIT in one round trip (one pgx batch,
// one Sync): the COMMIT runs only when the statement succeeded.
type commitAfter struct{ conn *pgx.Conn }

// errMarkBeforeCommit is the error of the statement sent before the COMMIT:
// when it comes from the server (a *pgconn.PgError), the COMMIT was skipped.
type errMarkBeforeCommit struct{ err error }

func (e *errMarkBeforeCommit) Error() string { return "mark: " + e.err.Error() }
func (e *errMarkBeforeCommit) Unwrap() error { return e.err }

func (c commitAfter) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	b.Queue("commit")
	br := c.conn.SendBatch(ctx, b)
	tag, err := br.Exec()
	if err != nil {
		_ = br.Close() // reads up to the Sync: the connection is usable again
		return tag, &errMarkBeforeCommit{err: err}
	}
	_, err = br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

func (c commitAfter) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return nil, errors.New("inbox: commitAfter runs one Exec")
}

func (c commitAfter) QueryRow(context.Context, string, ...any) pgx.Row {
	return errRow{errors.New("inbox: commitAfter runs one Exec")}
}

// endBatch ends the connection of an optimistic batch: whatever transaction
// it still has open (a batch that did not commit, whose pgx Tx may never
// have been closed) is rolled back before it goes back to the pool, which
// would otherwise close it. A connection that is broken or still busy is
// closed by Release.
func (w *InboxWorker) endBatch(ctx context.Context, conn *pgxpool.Conn) {
	c := conn.Conn()
	if !c.IsClosed() && !c.PgConn().IsBusy() && c.PgConn().TxStatus() != 'I' {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.QueryTimeout)
		_, _ = c.Exec(rctx, "rollback")
		cancel()
	}
	conn.Release()
}

// markBatch runs MarkInboxBatchProcessed, or nothing for an empty batch (an
// ordered batch whose events were all absorbed as duplicates).
func (w *InboxWorker) markBatch(ctx context.Context, tx pgx.Tx, p db.MarkInboxBatchProcessedParams) ([]string, error) {
	if len(p.DedupKeys) == 0 {
		return nil, nil
	}
	return w.q.MarkInboxBatchProcessed(ctx, tx, p)
}

// errFenced marks, for runIsolated, an event the optimistic run found taken
// over by another worker: its effect was rolled back and it is not run again.
var errFenced = errors.New("inbox: taken over by another worker")

// inFailedTransaction reports whether err says the transaction was already
// aborted by an earlier statement.
func inFailedTransaction(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "25P02"
}

// runIsolated processes evs in one transaction, a savepoint each, until
// stopEarly says so, and returns the outcomes and the events it did not start.
// An event in known is not run again: its failure is recorded.
func (w *InboxWorker) runIsolated(ctx context.Context, evs []*InboxEvent, stopEarly func() bool, known map[*InboxEvent]error) (results []result, rest []*InboxEvent, err error) {
	bctx, cancel := context.WithTimeout(ctx, w.cfg.QueryTimeout)
	tx, err := w.cfg.Pool.Begin(bctx)
	cancel()
	if err != nil {
		// Nothing ran: the claims are handed back by recover.
		return nil, nil, fmt.Errorf("inbox: begin batch: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var g gated
	if w.cfg.Ordered {
		if g, err = w.gate(ctx, tx, evs); err != nil {
			return nil, nil, err
		}
		evs = g.run
	}
	results = make([]result, 0, len(evs)+len(g.absorbed))
	results = append(results, g.absorbed...)
	// Ordered mode: once one of a key's events did not commit, its later
	// events of the batch are handed back unstarted.
	blocked := map[string]bool{}
	var woke int64
	for i, ev := range evs {
		if ev.KeySeq > 0 && blocked[ev.Key] {
			rest = append(rest, ev)
			continue
		}
		var r result
		if herr, ok := known[ev]; ok {
			// Already run: only its outcome is recorded, even past the
			// point where no handler starts any more.
			if herr == errFenced {
				results = append(results, result{ev: ev, fenced: true})
				continue
			}
			r, err = w.recordFailure(ctx, tx, ev, herr)
		} else {
			if stopEarly() {
				rest = append(rest, evs[i])
				continue
			}
			r, err = w.processOne(ctx, tx, ev)
		}
		if err != nil {
			return nil, nil, err
		}
		results = append(results, r)
		if w.cfg.Ordered && ev.KeySeq > 0 {
			if !r.processed {
				blocked[ev.Key] = true
				continue
			}
			n, err := w.advance(ctx, tx, []*InboxEvent{ev})
			if err != nil {
				return nil, nil, &errBatchBroken{err: err}
			}
			woke += n
		}
	}
	cctx, cancel := context.WithTimeout(ctx, w.cfg.QueryTimeout)
	defer cancel()
	if err := tx.Commit(cctx); err != nil {
		return nil, nil, &errBatchBroken{err: fmt.Errorf("commit: %w", err)}
	}
	if woke > 0 {
		w.wake.broadcast()
	}
	return results, rest, nil
}

// processOne runs one event's handler inside a savepoint of the batch
// transaction and records the outcome, fenced by the claim's lock_version.
func (w *InboxWorker) processOne(ctx context.Context, tx pgx.Tx, ev *InboxEvent) (result, error) {
	r := result{ev: ev}
	sp, err := tx.Begin(ctx)
	if err != nil {
		return r, &errBatchBroken{err: fmt.Errorf("savepoint: %w", err)}
	}
	start := time.Now()
	herr := w.callHandler(ctx, sp, ev)
	r.dur = time.Since(start)
	if herr == nil {
		n, err := w.q.MarkInboxProcessed(ctx, sp, db.MarkInboxProcessedParams{
			Handler: ev.Handler, DedupKey: ev.DedupKey, LockVersion: ev.LockVersion,
		})
		switch {
		case err != nil:
			// Typically the handler swallowed an error that aborted its
			// savepoint; the attempt failed.
			herr = fmt.Errorf("mark processed: %w", err)
		case n == 0:
			// Another worker took the event over: undo this side effect.
			if err := sp.Rollback(ctx); err != nil {
				return r, &errBatchBroken{err: fmt.Errorf("rollback fenced event: %w", err)}
			}
			r.fenced = true
			return r, nil
		default:
			if err := sp.Commit(ctx); err != nil {
				return r, &errBatchBroken{err: fmt.Errorf("release savepoint: %w", err)}
			}
			r.processed = true
			return r, nil
		}
	}
	// The handler failed: undo whatever it did, then record the failure.
	if err := sp.Rollback(ctx); err != nil {
		return r, &errBatchBroken{err: fmt.Errorf("rollback failed event: %w", err), culprit: ev, cause: herr}
	}
	fr, err := w.recordFailure(ctx, tx, ev, herr)
	fr.dur = r.dur
	return fr, err
}

// recordFailure records in tx where the event goes after its handler failed
// with herr, fenced by the claim's lock_version.
func (w *InboxWorker) recordFailure(ctx context.Context, tx pgx.Tx, ev *InboxEvent, herr error) (result, error) {
	r := result{ev: ev}
	r.d = decide(w.cfg.policy(), herr, ev.Attempts, ev.Deferrals, rand.Float64)
	n, err := w.applyDecision(ctx, tx, ev, r.d)
	if err != nil {
		return r, &errBatchBroken{err: fmt.Errorf("record failure: %w", err), culprit: ev, cause: herr}
	}
	r.fenced = n == 0
	return r, nil
}

func (w *InboxWorker) applyDecision(ctx context.Context, q db.DBTX, ev *InboxEvent, d decision) (int64, error) {
	switch d.outcome {
	case outcomeRetry:
		return w.q.RetryInbox(ctx, q, db.RetryInboxParams{
			Delay: interval(d.delay), LastError: d.reason, Handler: ev.Handler, DedupKey: ev.DedupKey, LockVersion: ev.LockVersion,
		})
	case outcomeDefer:
		return w.q.DeferInbox(ctx, q, db.DeferInboxParams{
			WaitingFor: d.waitingFor, Fallback: interval(d.delay), Handler: ev.Handler, DedupKey: ev.DedupKey,
			LockVersion: ev.LockVersion,
		})
	default:
		return w.q.KillInbox(ctx, q, db.KillInboxParams{
			LastError: d.reason, Handler: ev.Handler, DedupKey: ev.DedupKey, LockVersion: ev.LockVersion,
		})
	}
}

// callHandler runs the handler with its timeout, turning a panic into an error.
func (w *InboxWorker) callHandler(ctx context.Context, tx pgx.Tx, ev *InboxEvent) (err error) {
	hctx, cancel := context.WithTimeout(ctx, w.cfg.HandlerTimeout)
	defer cancel()
	defer func() {
		if p := recover(); p != nil {
			w.log.Error("inbox handler panicked", slog.String("event_id", ev.EventID),
				slog.Any("panic", p), slog.String("stack", string(debug.Stack())))
			err = fmt.Errorf("handler panicked: %v", p)
		}
	}()
	if err := expiredError(ev, time.Now()); err != nil {
		return err // never applied after its expiry
	}
	// Events the handler enqueues with its ctx record ev as their cause.
	err = w.cfg.Handler.Handle(contextWithCause(hctx, ev.Message), tx, ev)
	if err != nil && hctx.Err() == context.DeadlineExceeded && ctx.Err() == nil {
		err = fmt.Errorf("handler timed out after %s: %w", w.cfg.HandlerTimeout, err)
	}
	return err
}

// callBatchHandler runs the batch handler with the handler timeout, turning a
// panic into an error.
func (w *InboxWorker) callBatchHandler(ctx context.Context, tx pgx.Tx, bh InboxBatchHandler, evs []*InboxEvent) (err error) {
	hctx, cancel := context.WithTimeout(ctx, w.cfg.HandlerTimeout)
	defer cancel()
	defer func() {
		if p := recover(); p != nil {
			w.log.Error("inbox batch handler panicked", slog.Int("events", len(evs)),
				slog.Any("panic", p), slog.String("stack", string(debug.Stack())))
			err = fmt.Errorf("batch handler panicked: %v", p)
		}
	}()
	return bh.HandleBatch(hctx, tx, evs)
}

// Wake makes the worker poll for due events now, for a process that stored
// events (Receive) and runs its workers itself.
func (w *InboxWorker) Wake() { w.wake.broadcast() }

// report logs a committed outcome and tells the observer.
func (w *InboxWorker) report(r result) {
	ev := r.ev
	if w.cfg.Ordered {
		w.reportSequence(r)
		if r.absorbed {
			return
		}
	}
	switch {
	case r.fenced:
		w.log.Warn("inbox event fenced: another worker took it over; its side effect here was rolled back",
			slog.String("event_id", ev.EventID), slog.Int64("lock_version", ev.LockVersion))
		w.cfg.Observer.Fenced(ev)
	case r.processed:
		w.cfg.Observer.Processed(ev, r.dur)
	case r.d.outcome == outcomeRetry:
		w.log.Info("inbox event will be retried", slog.String("event_id", ev.EventID),
			slog.Int("attempt", ev.Attempts), slog.Duration("delay", r.d.delay), slog.String("error", r.d.reason))
		w.cfg.Observer.Retried(ev, r.d.reason)
	case r.d.outcome == outcomeDefer:
		w.log.Debug("inbox event deferred", slog.String("event_id", ev.EventID), slog.String("waiting_for", r.d.waitingFor))
		w.cfg.Observer.Deferred(ev)
	case r.d.outcome == outcomeDead:
		w.log.Warn("inbox event dead", slog.String("event_id", ev.EventID), slog.String("reason", r.d.reason))
		w.cfg.Observer.Dead(ev, r.d.reason)
	}
}

// recover repairs the state of a batch whose transaction failed: nothing of it
// committed. The event whose handler broke the transaction (a timeout that
// killed the connection, say) gets its failure recorded; the others are
// handed back with their attempt refunded. When no culprit is known (the
// commit itself failed) every event is retried with its attempt counted, so a
// batch that can never commit still reaches the attempt limit.
func (w *InboxWorker) recover(evs []*InboxEvent, batchErr error, shutdown bool) {
	ctx, cancel := context.WithTimeout(context.Background(), w.cfg.QueryTimeout)
	defer cancel()
	var broken *errBatchBroken
	errors.As(batchErr, &broken)
	w.log.Warn("inbox batch rolled back", slog.Any("error", batchErr), slog.Int("events", len(evs)))

	var handBack []*InboxEvent
	for _, ev := range evs {
		switch {
		case shutdown:
			handBack = append(handBack, ev)
		case broken != nil && broken.culprit == ev:
			d := decide(w.cfg.policy(), broken.cause, ev.Attempts, ev.Deferrals, rand.Float64)
			n, err := w.applyDecision(ctx, w.cfg.Pool, ev, d)
			if err != nil {
				w.log.Error("inbox: record failure", slog.String("event_id", ev.EventID), slog.Any("error", err))
				continue
			}
			w.report(result{ev: ev, fenced: n == 0, d: d})
			if n > 0 && d.outcome == outcomeDefer {
				w.wakeReleased(ctx, []string{d.waitingFor}, false)
			}
		case broken != nil && broken.culprit == nil:
			d := decide(w.cfg.policy(), batchErr, ev.Attempts, ev.Deferrals, rand.Float64)
			if d.outcome == outcomeDefer {
				d = decision{outcome: outcomeRetry, delay: w.cfg.BackoffMin, reason: batchErr.Error()}
			}
			n, err := w.applyDecision(ctx, w.cfg.Pool, ev, d)
			if err != nil {
				w.log.Error("inbox: record failure", slog.String("event_id", ev.EventID), slog.Any("error", err))
				continue
			}
			w.report(result{ev: ev, fenced: n == 0, d: d})
		default:
			handBack = append(handBack, ev)
		}
	}
	if len(handBack) > 0 {
		w.unclaim(ctx, handBack)
	}
}

// unclaim hands claimed events back: pending, due now, attempt refunded.
func (w *InboxWorker) unclaim(ctx context.Context, evs []*InboxEvent) {
	p := db.UnclaimInboxParams{
		Handler: w.cfg.HandlerName, DedupKeys: make([]string, len(evs)), LockVersions: make([]int64, len(evs)),
	}
	for i, ev := range evs {
		p.DedupKeys[i], p.LockVersions[i] = ev.DedupKey, ev.LockVersion
	}
	n, err := w.q.UnclaimInbox(ctx, w.cfg.Pool, p)
	if err != nil {
		w.log.Error("inbox: hand back claims; they return when their lease expires", slog.Any("error", err))
		return
	}
	w.log.Info("inbox claims handed back", slog.Int64("events", n))
	w.wake.broadcast()
}

// wakeReleased runs after a batch committed its deferrals and releases: it
// makes due the events deferred on keys whose release is committed, and wakes
// this process's goroutines when it did, or when wake is set (the batch
// released something). Neither side of a deferral/release race holds a lock
// across its transaction; instead each side checks the other's committed
// record after its own commit, so whichever commits second finds the first.
// A failure here is only logged: the sweep (sweepReleased) repairs it.
func (w *InboxWorker) wakeReleased(ctx context.Context, keys []string, wake bool) {
	if len(keys) > 0 {
		slices.Sort(keys)
		keys = slices.Compact(keys)
		qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.QueryTimeout)
		n, err := w.q.WakeReleasedInbox(qctx, w.cfg.Pool, keys)
		cancel()
		if err != nil {
			w.log.Warn("inbox: check releases after commit; the sweep will", slog.Any("error", err))
		}
		wake = wake || n > 0
	}
	if wake {
		w.wake.broadcast()
	}
}

// sweepReleased makes due, about every PollInterval, the deferred events whose
// dependency has a committed release that no check after a commit caught (a
// process that died in between, or Release called outside a handler).
func (w *InboxWorker) sweepReleased(ctx context.Context) {
	for {
		t := time.NewTimer(wait.Jitter(w.cfg.PollInterval, jitterSpread))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		qctx, cancel := context.WithTimeout(ctx, w.cfg.QueryTimeout)
		n, err := w.q.SweepReleasedInbox(qctx, w.cfg.Pool, 1000)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil:
			w.log.Warn("inbox: sweep released deferrals", slog.Any("error", err))
		case n > 0:
			w.log.Info("inbox: deferred events made due by the release sweep", slog.Int64("events", n))
			w.wake.broadcast()
		}
	}
}

// waker wakes every goroutine waiting on the current channel at once.
type waker struct {
	mu sync.Mutex
	ch chan struct{}
}

func newWaker() *waker { return &waker{ch: make(chan struct{})} }

func (w *waker) channel() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ch
}

func (w *waker) broadcast() {
	w.mu.Lock()
	defer w.mu.Unlock()
	close(w.ch)
	w.ch = make(chan struct{})
}

// jitterSpread is the jitter of the workers' polls: ×0.5–1.5.
const jitterSpread = 0.5
