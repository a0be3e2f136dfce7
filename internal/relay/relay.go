// Package relay publishes committed outbox rows to a broker. The outbox is
// split into partitions (by key); a relay leases partitions, and for each one
// publishes pending rows in id order, waits for every acknowledgement, then
// marks them published in one statement fenced by the lease's epoch. Several
// relays share the partitions fairly; a crashed relay's partitions are taken
// over when its leases expire.
package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/internal/db"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/maintenance"
	"github.com/pgrelay/pgrelay/internal/notifier"
	"github.com/pgrelay/pgrelay/internal/wait"
)

// Relay is the outbox relay service.
type Relay struct {
	cfg Config
	q   *db.Queries
	log *zap.Logger

	// notifier wakes the partition workers on outbox inserts and the
	// heartbeat when a peer released partitions.
	notifier *notifier.Notifier
	// cleaner deletes published rows past the retention.
	cleaner *OutboxCleaner

	mu      sync.Mutex
	workers map[int32]*worker
	wg      sync.WaitGroup

	// clock is the origin of lease deadlines: they are kept as durations
	// since it, on the process's monotonic clock, so a wall-clock step can
	// neither extend nor shorten a lease.
	clock time.Time
	// kick asks Run for a heartbeat now (a peer released partitions).
	kick chan struct{}
	// busy wakes pollBusy when a worker starts lingering.
	busy chan struct{}
	// poolWarnedShare is the share last warned about as too large for the
	// pool (0: none); touched by Run's goroutine only.
	poolWarnedShare int
}

// PoolConns is how many connections a relay owning partitions uses at most
// at once: per partition the read of its next batch and the mark of the
// previous one, which run at the same time, plus the heartbeat, the
// retention delete, the statistics check and the poll of busy partitions.
// (The LISTEN connection is dialled beside the pool.) A
// smaller pool makes partition workers queue for connections: with 16
// partitions on a 6-connection pool the relay drained 40–80 % slower.
func PoolConns(partitions int) int { return 2*partitions + 4 }

// New returns a Relay, or an error naming the invalid Config field.
func New(cfg Config) (*Relay, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	r := &Relay{
		cfg:     cfg,
		q:       db.New(),
		log:     cfg.Logger.Named("relay").With(zap.String("node", cfg.NodeID)),
		workers: map[int32]*worker{},
		clock:   time.Now(),
		kick:    make(chan struct{}, 1),
		busy:    make(chan struct{}, 1),
	}
	n, err := notifier.New(notifier.Config{
		Pool: cfg.Pool,
		Topics: []notifier.Topic{
			{Channel: notifier.OutboxChannel, Notify: r.wakePartitions},
			{Channel: notifier.RelaysChannel, Notify: func(string) { r.kickHeartbeat() }},
		},
		OnListen:     r.wakeAll, // notifications sent while not listening are lost
		Backoff:      r.backoffPolicy(),
		QueryTimeout: cfg.QueryTimeout,
		Logger:       r.log,
	})
	if err != nil {
		return nil, fmt.Errorf("relay: %w", err)
	}
	r.notifier = n
	r.cleaner = newOutboxCleaner(cfg, r.log)
	return r, nil
}

// NodeID returns the name this relay owns partitions under.
func (r *Relay) NodeID() string { return r.cfg.NodeID }

// Run relays until ctx is cancelled, then finishes the batches in flight,
// releases its leases and returns nil. Database and broker failures are
// retried with backoff; they never end Run.
func (r *Relay) Run(ctx context.Context) error {
	r.log.Info("relay starting", zap.Int("batch_size", r.cfg.BatchSize), zap.Duration("lease", r.cfg.Lease))
	var bg sync.WaitGroup
	bg.Add(4)
	go func() { defer bg.Done(); r.pollBusy(ctx) }()
	go func() { defer bg.Done(); r.notifier.Run(ctx) }()
	go func() { defer bg.Done(); r.cleaner.Run(ctx) }()
	stats := maintenance.Statistics{Pool: r.cfg.Pool, Table: "outbox", Interval: r.cfg.StatisticsInterval, Logger: r.log}
	go func() { defer bg.Done(); stats.Run(ctx) }()

	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			r.shutdown()
			bg.Wait()
			r.log.Info("relay stopped")
			return nil
		case <-t.C:
		case <-r.kick:
			if !t.Stop() {
				select {
				case <-t.C:
				default:
				}
			}
		}
		if err := r.tick(ctx); err != nil && ctx.Err() == nil {
			r.log.Warn("lease heartbeat failed", zap.Error(err))
		}
		t.Reset(wait.Jitter(r.cfg.HeartbeatInterval, jitterSpread))
	}
}

// tick registers this relay, renews its leases, and gives up or acquires
// partitions so that it owns its fair share.
func (r *Relay) tick(ctx context.Context) error {
	if h := r.cfg.hooks.beforeHeartbeat; h != nil {
		h()
	}
	qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	pool := r.cfg.Pool
	if err := r.q.HeartbeatNode(qctx, pool, r.cfg.NodeID); err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	leaseSecs := r.cfg.Lease.Seconds()
	// A lease renewed or taken by a statement sent now lasts at least until
	// now + Lease on this process's clock: the database's lease_until
	// is computed later, from the same duration.
	deadline := r.leaseDeadline()
	renewed, err := r.q.RenewLeases(qctx, pool, db.RenewLeasesParams{LeaseSeconds: leaseSecs, Owner: r.cfg.NodeID})
	if err != nil {
		return fmt.Errorf("renew leases: %w", err)
	}
	held := make(map[int32]int64, len(renewed))
	for _, l := range renewed {
		held[l.Partition] = l.Epoch
	}

	r.mu.Lock()
	var owned []int32
	for p, w := range r.workers {
		if w.stopping() {
			continue
		}
		if e, ok := held[p]; !ok || e != w.epoch {
			r.log.Warn("partition lease lost", zap.Int32("partition", p), zap.Int64("epoch", w.epoch))
			r.cfg.Observer.LeaseLost(int(p))
			w.stop(false)
			continue
		}
		w.leaseUntil.Store(int64(deadline))
		owned = append(owned, p)
	}
	// A lease held with no worker (its release failed) is worked again
	// rather than renewed forever with nobody publishing.
	var orphans []db.RenewLeasesRow
	for _, l := range renewed {
		if r.workers[l.Partition] == nil {
			orphans = append(orphans, l)
			owned = append(owned, l.Partition)
		}
	}
	r.mu.Unlock()
	for _, l := range orphans {
		r.startWorker(ctx, l.Partition, l.Epoch, deadline)
	}

	live, err := r.q.CountLiveNodes(qctx, pool, leaseSecs)
	if err != nil {
		return fmt.Errorf("count relays: %w", err)
	}
	total, err := r.q.CountPartitions(qctx, pool)
	if err != nil {
		return fmt.Errorf("count partitions: %w", err)
	}
	if live < 1 {
		live = 1
	}
	share := (int(total) + int(live) - 1) / int(live)
	r.checkPoolSize(share)

	switch {
	case len(owned) > share:
		// Give up the highest partitions beyond the fair share; each worker
		// finishes its batch, then releases its lease.
		sort.Slice(owned, func(i, j int) bool { return owned[i] > owned[j] })
		r.mu.Lock()
		for _, p := range owned[:len(owned)-share] {
			r.log.Info("releasing partition to rebalance", zap.Int32("partition", p), zap.Int("share", share))
			r.workers[p].stop(true)
		}
		r.mu.Unlock()
	case len(owned) < share:
		deadline := r.leaseDeadline()
		got, err := r.q.AcquirePartitions(qctx, pool, db.AcquirePartitionsParams{
			Owner: r.cfg.NodeID, LeaseSeconds: leaseSecs, MaxCount: int32(share - len(owned)),
		})
		if err != nil {
			return fmt.Errorf("acquire partitions: %w", err)
		}
		for _, a := range got {
			takenOver := a.PreviousOwner != nil
			r.log.Info("partition acquired", zap.Int32("partition", a.Partition), zap.Int64("epoch", a.Epoch), zap.Bool("taken_over", takenOver))
			r.cfg.Observer.LeaseAcquired(int(a.Partition), a.Epoch, takenOver)
			r.startWorker(ctx, a.Partition, a.Epoch, deadline)
		}
	}
	r.mu.Lock()
	working := 0
	for _, w := range r.workers {
		if !w.stopping() {
			working++
		}
	}
	r.mu.Unlock()
	r.cfg.Observer.PartitionsHeld(working)
	if rand.IntN(20) == 0 {
		if err := r.q.DeleteStaleNodes(qctx, pool, 10*leaseSecs); err != nil {
			return fmt.Errorf("delete stale relays: %w", err)
		}
	}
	return nil
}

// checkPoolSize warns, once per share, when the pool is too small for the
// partitions the relay is to own.
func (r *Relay) checkPoolSize(share int) {
	have, want := int(r.cfg.Pool.Config().MaxConns), PoolConns(share)
	if have >= want || share == r.poolWarnedShare {
		return
	}
	r.poolWarnedShare = share
	r.log.Warn("the database pool is smaller than the relay's partitions use at once; their reads and marks queue for connections (raise pool_max_conns)",
		zap.Int("pool_max_conns", have), zap.Int("partitions", share), zap.Int("wanted_conns", want))
}

// shutdown stops every worker, waits for the batches in flight, and releases
// the leases so that other relays take the partitions over at once.
func (r *Relay) shutdown() {
	r.mu.Lock()
	var parts []int32
	for p, w := range r.workers {
		if !w.stopping() {
			parts = append(parts, p)
		}
		w.stop(false)
	}
	r.mu.Unlock()
	r.wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.QueryTimeout)
	defer cancel()
	// One transaction, so that a peer woken by the notification already
	// counts one relay fewer when it computes its share.
	err := pgx.BeginFunc(ctx, r.cfg.Pool, func(tx pgx.Tx) error {
		if len(parts) > 0 {
			if _, err := r.q.ReleasePartitions(ctx, tx, db.ReleasePartitionsParams{Owner: r.cfg.NodeID, Partitions: parts}); err != nil {
				return fmt.Errorf("release leases: %w", err)
			}
		}
		if err := r.q.DeleteNode(ctx, tx, r.cfg.NodeID); err != nil {
			return fmt.Errorf("unregister: %w", err)
		}
		return r.q.NotifyRelays(ctx, tx, "left "+r.cfg.NodeID)
	})
	if err != nil {
		r.log.Warn("release leases and unregister; other relays take the partitions over when the leases expire", zap.Error(err))
	}
}

// kickHeartbeat asks Run for a heartbeat now; requests coalesce.
func (r *Relay) kickHeartbeat() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// wakeAll nudges every partition worker to look for rows now.
func (r *Relay) wakeAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range r.workers {
		w.nudge()
	}
}

// wakePartitions nudges the workers of the partitions named in a
// notification payload ("3,7,12"); a payload it cannot parse wakes them all.
func (r *Relay) wakePartitions(payload string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range strings.Split(payload, ",") {
		p, err := strconv.ParseInt(s, 10, 32)
		if err != nil {
			for _, w := range r.workers {
				w.nudge()
			}
			return
		}
		if w := r.workers[int32(p)]; w != nil {
			w.nudge()
		}
	}
}

// worker publishes one leased partition.
type worker struct {
	partition int32
	epoch     int64
	// leaseUntil is when the lease ends at the latest, as a duration since
	// Relay.clock: a batch is published only before it.
	leaseUntil atomic.Int64
	// lingerUntil (UnixNano) is when the worker, idle after finding rows,
	// stops relying on pollBusy and arms the partition's wake-up; 0: not
	// lingering.
	lingerUntil atomic.Int64
	ctx         context.Context // cancelled to stop between batches
	cancel      context.CancelFunc
	release     bool // set before cancel: release the lease when done
	wake        chan struct{}
	done        chan struct{}
}

func (w *worker) stopping() bool { return w.ctx.Err() != nil }

// nudge wakes the worker if it is idle; nudges coalesce.
func (w *worker) nudge() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// stop asks the worker to stop after its current batch; with release it then
// gives its lease up. Called with Relay.mu held.
func (w *worker) stop(release bool) {
	if w.ctx.Err() == nil {
		w.release = release
		w.cancel()
	}
}

// startWorker starts publishing partition p at epoch. Called without r.mu.
func (r *Relay) startWorker(parent context.Context, p int32, epoch int64, leaseUntil time.Duration) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(parent))
	w := &worker{partition: p, epoch: epoch, ctx: ctx, cancel: cancel, wake: make(chan struct{}, 1), done: make(chan struct{})}
	w.leaseUntil.Store(int64(leaseUntil))
	r.mu.Lock()
	prev := r.workers[p]
	r.workers[p] = w
	if prev != nil {
		prev.stop(false)
	}
	r.mu.Unlock()
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer close(w.done)
		if prev != nil {
			<-prev.done
		}
		r.workSafely(w)
		r.mu.Lock()
		release := w.release
		r.mu.Unlock()
		// Release before leaving the map, so a heartbeat never sees the
		// lease still held with no worker.
		if release {
			qctx, cancel := context.WithTimeout(context.Background(), r.cfg.QueryTimeout)
			err := pgx.BeginFunc(qctx, r.cfg.Pool, func(tx pgx.Tx) error {
				if _, err := r.q.ReleasePartitions(qctx, tx, db.ReleasePartitionsParams{Owner: r.cfg.NodeID, Partitions: []int32{p}}); err != nil {
					return err
				}
				return r.q.NotifyRelays(qctx, tx, "released "+strconv.Itoa(int(p)))
			})
			cancel()
			if err != nil {
				r.log.Warn("release lease", zap.Int32("partition", p), zap.Error(err))
			}
		}
		r.mu.Lock()
		if r.workers[p] == w {
			delete(r.workers, p)
		}
		r.mu.Unlock()
	}()
}

// errFenced reports a mark refused because the partition has a new owner.
var errFenced = errors.New("fenced: the partition was taken over")

// errLeaseExpired reports a batch not published because the lease could have
// expired (the relay was paused, or its heartbeats failed): another relay may
// own the partition and have published the rows already.
var errLeaseExpired = errors.New("lease expired before publishing: the batch was not published")

// leaseDeadline is the end of a lease renewed or taken by a statement sent
// now, on the monotonic clock.
func (r *Relay) leaseDeadline() time.Duration {
	return time.Since(r.clock) + r.cfg.Lease
}

// leaseEnd returns when w's lease ends at the latest, as a time carrying a
// monotonic reading.
func (r *Relay) leaseEnd(w *worker) time.Time {
	return r.clock.Add(time.Duration(w.leaseUntil.Load()))
}

// workSafely runs the worker, turning a panic (in an Observer, say) into the
// worker's end: the lease stays held, and the next heartbeat starts a new
// worker for it.
func (r *Relay) workSafely(w *worker) {
	defer func() {
		if p := recover(); p != nil {
			r.log.Error("partition worker panicked; restarting it at the next heartbeat", zap.Int32("partition", w.partition), zap.Any("panic", p))
			w.cancel()
		}
	}()
	r.work(w)
}

func (r *Relay) work(w *worker) {
	log := r.log.With(zap.Int32("partition", w.partition), zap.Int64("epoch", w.epoch))
	bo := r.newBackoff()
	// armed is set once this worker armed the partition's wake-up and then
	// found nothing: the next insert into the partition notifies it.
	armed := false
	var lastArmed, lastRows time.Time
	// inflight is the mark of the last full batch, running while the next
	// batch is read and published; it is always awaited before the worker
	// idles, backs off or ends.
	inflight := &pendingMark{}
	defer func() { _ = r.awaitMark(w, log, inflight) }()
	for w.ctx.Err() == nil {
		n, err := r.runBatch(w, log, bo, inflight)
		if err == nil && n < r.cfg.BatchSize {
			err = r.awaitMark(w, log, inflight)
		}
		switch {
		case errors.Is(err, errFenced):
			w.cancel()
			return
		case err != nil:
			if errors.Is(r.awaitMark(w, log, inflight), errFenced) {
				w.cancel()
				return
			}
			d := bo.Last()
			log.Warn("publishing failed; the partition backs off and retries in order", zap.Error(err), zap.Duration("backoff", d))
			wait.Sleep(w.ctx, d)
			continue
		}
		bo.Reset()
		if n > 0 {
			armed = false // a notification may have been spent on these rows
			lastRows = time.Now()
		}
		if n == r.cfg.BatchSize {
			continue
		}
		if !armed {
			// Rows came within the last lingerFor: stay awake and let
			// pollBusy look for more every busyPollInterval instead of
			// arming. A producer whose insert finds its partition armed
			// notifies, and PostgreSQL serializes notifying commits
			// (including their WAL flush): under a steady stream of small
			// transactions, re-arming after every batch made nearly every
			// producer commit notify, one at a time.
			if until := lastRows.Add(lingerFor); time.Now().Before(until) {
				w.lingerUntil.Store(until.UnixNano())
				select {
				case r.busy <- struct{}{}:
				default:
				}
				r.sleepOrWake(w, time.Until(until))
				w.lingerUntil.Store(0)
				continue
			}
			// Arm at most once per wakeInterval: under a steady trickle the
			// worker polls at that pace instead, so producers notify at most
			// once per partition per interval.
			if wait := wakeInterval - time.Since(lastArmed); wait > 0 {
				r.sleepOrWake(w, wait)
				continue
			}
			lastArmed = time.Now()
			nudged, err := r.arm(w)
			switch {
			case err != nil:
				if w.ctx.Err() == nil {
					log.Warn("arming the partition's wake-up failed; polling", zap.Error(err))
				}
			case nudged:
				continue // the notification disarmed the partition
			default:
				armed = true
				continue // look again: rows committed while arming
			}
		}
		if r.sleepOrWake(w, wait.Jitter(r.cfg.PollInterval, jitterSpread)) {
			armed = false // the notification disarmed the partition
		}
	}
}

// wakeInterval is the shortest time between two armings of a partition's
// wake-up by its worker.
const wakeInterval = 1 * time.Millisecond

// lingerFor is how long a worker that found rows stays awake, polled by
// pollBusy, before it arms its partition's wake-up; busyPollInterval is how
// often pollBusy looks, with one statement for all lingering partitions.
const (
	lingerFor        = 250 * time.Millisecond
	busyPollInterval = 2 * time.Millisecond
)

// pollBusy looks every busyPollInterval, while any worker lingers, for
// pending rows in the lingering partitions (PendingPartitions: one probe of
// the pending index per partition) and nudges their workers. It costs
// nothing while no partition has had rows in the last lingerFor.
func (r *Relay) pollBusy(ctx context.Context) {
	var parts []int32
	for ctx.Err() == nil {
		now := time.Now().UnixNano()
		parts = parts[:0]
		r.mu.Lock()
		for p, w := range r.workers {
			if w.lingerUntil.Load() > now {
				parts = append(parts, p)
			}
		}
		r.mu.Unlock()
		if len(parts) == 0 {
			select {
			case <-ctx.Done():
				return
			case <-r.busy:
			}
			continue
		}
		qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
		found, err := r.q.PendingPartitions(qctx, r.cfg.Pool, parts)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil:
			// The lingering workers arm at the end of their linger.
			r.log.Debug("polling busy partitions failed", zap.Error(err))
			wait.Sleep(ctx, lingerFor)
			continue
		case err == nil && len(found) > 0:
			r.mu.Lock()
			for _, p := range found {
				if w := r.workers[p]; w != nil {
					w.nudge()
				}
			}
			r.mu.Unlock()
		}
		wait.Sleep(ctx, busyPollInterval)
	}
}

// sleepOrWake waits for d, a nudge or the worker's end. It reports whether a
// nudge ended the wait.
func (r *Relay) sleepOrWake(w *worker, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-w.ctx.Done():
	case <-w.wake:
		return true
	case <-t.C:
	}
	return false
}

// arm asks the outbox insert trigger to notify the next insert into w's
// partition, then waits until every transaction that was running when the
// arming committed has ended, a notification arrives (nudged), or
// PollInterval has passed. A transaction running then may have inserted into
// the partition before it was armed (so it will not notify) and be committing
// only now; once it has ended, the next read sees its rows. Later inserts see
// the partition armed and notify.
func (r *Relay) arm(w *worker) (nudged bool, err error) {
	qctx, cancel := context.WithTimeout(w.ctx, r.cfg.QueryTimeout)
	defer cancel()
	if err := r.q.ArmWakeup(qctx, r.cfg.Pool, w.partition); err != nil {
		return false, fmt.Errorf("arm wake-up: %w", err)
	}
	xids, err := r.q.InProgressXids(qctx, r.cfg.Pool)
	if err != nil {
		return false, fmt.Errorf("list running transactions: %w", err)
	}
	if h := r.cfg.hooks.afterArm; h != nil {
		h(w.partition)
	}
	deadline := time.Now().Add(r.cfg.PollInterval)
	pause := 200 * time.Microsecond
	for len(xids) > 0 {
		cctx, cancel := context.WithTimeout(w.ctx, r.cfg.QueryTimeout)
		n, err := r.q.CountInProgress(cctx, r.cfg.Pool, xids)
		cancel()
		if err != nil {
			return false, fmt.Errorf("check running transactions: %w", err)
		}
		left := time.Until(deadline)
		if n == 0 || left <= 0 {
			break
		}
		if h := r.cfg.hooks.armWait; h != nil {
			h(w.partition)
		}
		if r.sleepOrWake(w, min(pause, left)) {
			return true, nil
		}
		pause = min(pause*2, 20*time.Millisecond)
	}
	return false, w.ctx.Err()
}

// runBatch publishes the next batch of the partition and marks it. It returns
// the number of rows read.
// A failure advances bo, so that the retry time recorded on the rows is the
// one the worker waits for.
func (r *Relay) runBatch(w *worker, log *zap.Logger, bo *retryBackoff, inflight *pendingMark) (int, error) {
	n, err := r.runBatchOnce(w, log, bo, inflight)
	if err != nil && !errors.Is(err, errFenced) && !bo.advanced {
		bo.Next()
	}
	bo.advanced = false
	return n, err
}

// pendingMark is a batch's mark running in the background.
type pendingMark struct {
	ids  []int64    // the batch's rows, excluded from the next read
	done chan error // receives the mark's outcome; nil when none runs
	rows int        // the batch's size
}

// awaitMark waits for the mark in flight, if any, and returns its error
// (errFenced when the partition was taken over).
func (r *Relay) awaitMark(w *worker, log *zap.Logger, m *pendingMark) error {
	if m.done == nil {
		return nil
	}
	err := <-m.done
	m.done, m.ids = nil, nil
	if err != nil && !errors.Is(err, errFenced) {
		log.Warn("marking a published batch failed; it is published again (JetStream drops the duplicates)", zap.Int("rows", m.rows), zap.Error(err))
	}
	return err
}

// runBatchOnce reads the next batch (past the batch whose mark is in
// flight), publishes it, and marks it. A full batch published without a
// transient failure is marked in the background while the worker reads and
// publishes the next one: the next batch holds only rows after it (each
// key's earlier rows are acknowledged), and its own mark waits for this one,
// so a fenced or failed mark stops the partition before anything later is
// marked.
func (r *Relay) runBatchOnce(w *worker, log *zap.Logger, bo *retryBackoff, inflight *pendingMark) (int, error) {
	exclude := inflight.ids
	if exclude == nil {
		exclude = []int64{}
	}
	qctx, cancel := context.WithTimeout(context.Background(), r.cfg.QueryTimeout)
	rows, err := r.q.PendingBatch(qctx, r.cfg.Pool, db.PendingBatchParams{Partition: w.partition, BatchSize: int32(r.cfg.BatchSize), Exclude: exclude})
	cancel()
	if err != nil {
		return 0, fmt.Errorf("read pending rows: %w", err)
	}
	if h := r.cfg.hooks.afterRead; h != nil {
		h(w.partition, len(rows))
	}
	if len(rows) == 0 {
		return 0, nil
	}

	// Rows whose headers cannot be carried are dead before publishing.
	results := make([]broker.Result, len(rows))
	msgs := make([]broker.Message, 0, len(rows))
	idx := make([]int, 0, len(rows))
	for i, row := range rows {
		m := event.Message{EventID: row.EventID, Topic: row.Topic, Key: row.Key, EventType: row.EventType, Payload: row.Payload, OccurredAt: row.OccurredAt}
		if row.KeySeq != nil {
			m.KeySeq = *row.KeySeq
		}
		if len(row.Headers) > 0 && string(row.Headers) != "{}" {
			if err := json.Unmarshal(row.Headers, &m.Headers); err != nil {
				results[i].Err = broker.Terminalf("headers must be a JSON object of strings: %v", err)
				continue
			}
		}
		msgs = append(msgs, m)
		idx = append(idx, i)
	}
	if h := r.cfg.hooks.beforePublish; h != nil {
		h(w.partition)
	}
	// A relay paused past its lease (a stop-the-world pause, a suspended VM,
	// failed heartbeats) must not publish the batch it read before: another
	// relay may have taken the partition and published these rows, and once
	// the broker's duplicate window has passed they would be stored twice.
	// Publishing stops at the lease's end, too.
	leaseEnd := r.leaseEnd(w)
	if !time.Now().Before(leaseEnd) {
		log.Warn("lease may have expired; the batch read before is not published", zap.Int("rows", len(rows)))
		return len(rows), errLeaseExpired
	}
	if len(msgs) > 0 {
		start := time.Now()
		for j, res := range r.publish(msgs, leaseEnd) {
			results[idx[j]] = res
		}
		r.cfg.Observer.PublishDuration(int(w.partition), len(msgs), time.Since(start))
	}
	ids := make([]int64, len(rows))
	for i, row := range rows {
		ids[i] = row.ID
	}
	if h := r.cfg.hooks.afterPublish; h != nil {
		h(w.partition, ids)
	}

	// Mark every row with an outcome: published, or dead when rejected
	// permanently. Rows that failed transiently stay pending and are retried
	// after a backoff. They are always a suffix of their key's rows in the
	// batch (the publisher sends nothing of a key after its transient
	// failure), so per-key order holds while the other keys move on.
	var markIDs, failedIDs []int64
	deadIDs, reasons := []int64{}, []string{} // never NULL
	published, dead, dups := 0, 0, 0
	var transient error
	for i, res := range results {
		if res.Err != nil && !broker.IsTerminal(res.Err) {
			if transient == nil {
				transient = res.Err
			}
			failedIDs = append(failedIDs, rows[i].ID)
			continue
		}
		markIDs = append(markIDs, rows[i].ID)
		if res.Err != nil {
			deadIDs = append(deadIDs, rows[i].ID)
			reasons = append(reasons, res.Err.Error())
			dead++
			log.Warn("event rejected permanently; marked dead", zap.String("event_id", rows[i].EventID), zap.Error(res.Err))
			continue
		}
		published++
		if res.Duplicate {
			dups++
		}
	}
	// The previous batch's mark first: this batch is marked only after it.
	if err := r.awaitMark(w, log, inflight); err != nil {
		return len(rows), err
	}
	mark := func() error {
		if len(markIDs) == 0 {
			return nil
		}
		qctx, cancel := context.WithTimeout(context.Background(), r.cfg.QueryTimeout)
		n, err := r.q.MarkOutcomes(qctx, r.cfg.Pool, db.MarkOutcomesParams{
			Partition: w.partition, Owner: r.cfg.NodeID, Epoch: w.epoch, Ids: markIDs, DeadIds: deadIDs, DeadReasons: reasons,
		})
		cancel()
		if err != nil {
			return fmt.Errorf("mark %d rows: %w", len(markIDs), err)
		}
		if n == 0 {
			log.Warn("mark fenced: another relay owns the partition now; it republishes the batch", zap.Int("rows", len(markIDs)))
			r.cfg.Observer.Fenced(int(w.partition))
			return errFenced
		}
		if published > 0 {
			r.cfg.Observer.Published(int(w.partition), published, dups, time.Since(rows[0].CreatedAt))
		}
		if dead > 0 {
			r.cfg.Observer.MarkedDead(int(w.partition), dead)
		}
		return nil
	}
	if transient == nil && len(rows) == r.cfg.BatchSize && w.ctx.Err() == nil {
		done := make(chan error, 1)
		inflight.done, inflight.ids, inflight.rows = done, ids, len(rows)
		go func() {
			defer func() {
				if p := recover(); p != nil {
					// An Observer's panic, after the mark committed.
					log.Error("panic while marking a batch", zap.Any("panic", p))
					done <- fmt.Errorf("panic while marking: %v", p)
				}
			}()
			done <- mark()
		}()
		return len(rows), nil
	}
	if err := mark(); err != nil {
		return len(rows), err
	}
	if transient != nil {
		rest := failedIDs
		r.cfg.Observer.PublishFailed(int(w.partition), len(rest), transient)
		retryAt := time.Now().Add(bo.Next())
		bo.advanced = true
		qctx, cancel := context.WithTimeout(context.Background(), r.cfg.QueryTimeout)
		_, err := r.q.RecordPublishFailure(qctx, r.cfg.Pool, db.RecordPublishFailureParams{
			LastError: transient.Error(), NextAttemptAt: &retryAt, Ids: rest, Partition: w.partition, Owner: r.cfg.NodeID, Epoch: w.epoch,
		})
		cancel()
		if err != nil {
			log.Warn("record publish failure", zap.Error(err))
		}
		return len(rows), fmt.Errorf("publish: %w", transient)
	}
	return len(rows), nil
}

// publish calls the Publisher, turning a panic into a transient failure of
// the whole batch.
func (r *Relay) publish(msgs []broker.Message, leaseEnd time.Time) (results []broker.Result) {
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.PublishTimeout)
	defer cancel()
	ctx, cancelLease := context.WithDeadline(ctx, leaseEnd)
	defer cancelLease()
	defer func() {
		if p := recover(); p != nil {
			r.log.Error("publisher panicked", zap.Any("panic", p))
			results = make([]broker.Result, len(msgs))
			for i := range results {
				results[i].Err = fmt.Errorf("publisher panicked: %v", p)
			}
		}
	}()
	results = r.cfg.Publisher.Publish(ctx, msgs)
	if len(results) != len(msgs) {
		err := fmt.Errorf("publisher returned %d results for %d messages", len(results), len(msgs))
		results = make([]broker.Result, len(msgs))
		for i := range results {
			results[i].Err = err
		}
	}
	return results
}

// retryBackoff is a partition's backoff, and whether the current batch has
// already advanced it.
type retryBackoff struct {
	*wait.Backoff
	advanced bool // Next was called during the current batch
}

func (r *Relay) newBackoff() *retryBackoff {
	return &retryBackoff{Backoff: wait.New(r.backoffPolicy())}
}

// backoffPolicy is the relay's backoff: from BackoffMin, doubling up to
// BackoffMax, ±10%.
func (r *Relay) backoffPolicy() wait.Policy {
	return wait.Policy{Min: r.cfg.BackoffMin, Max: r.cfg.BackoffMax, Spread: jitterSpread}
}

// jitterSpread is the relay's jitter on its polls, heartbeats and backoffs:
// ±10%.
const jitterSpread = 0.1
