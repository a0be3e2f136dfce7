package relay

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgrelay/pgrelay/internal/db"
	"github.com/pgrelay/pgrelay/internal/wait"
)

// kickHeartbeat asks Run for a heartbeat now; requests coalesce.
func (r *engine) kickHeartbeat() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// listening runs each time the LISTEN connection is (re-)established: the
// notifications sent meanwhile are lost, a requeue's among them, so every
// worker looks again, from the start (scanFloor).
func (r *engine) listening() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range r.workers {
		w.floor.rescan()
		w.nudge()
	}
}

// wakePartitions nudges the workers of the partitions named in a
// notification payload ("3,7,12"); a payload it cannot parse wakes them all.
// "requeue:3,7" (AdminNotifyOutbox) names partitions with rows requeued
// below their scan floor: their next claims start from the start.
func (r *engine) wakePartitions(payload string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	list, requeue := strings.CutPrefix(payload, "requeue:")
	for _, s := range strings.Split(list, ",") {
		p, err := strconv.ParseInt(s, 10, 32)
		if err != nil {
			for _, w := range r.workers {
				w.nudge()
			}
			return
		}
		if w := r.workers[int32(p)]; w != nil {
			if requeue {
				w.floor.rescan()
			}
			w.nudge()
		}
	}
}

// wakeInterval is the shortest time between two armings of a partition's
// wake-up by its worker.
const wakeInterval = 1 * time.Millisecond

// lingerFor is how long a worker that found rows stays awake, read for by
// pollBusy, before it arms its partition's wake-up. pollBusy reads all
// lingering partitions with one statement, busyPollInterval after a read
// that found at least busyPollFull rows, busyPollCoalesce after one that
// found fewer: at moderate loads each read (and the publishes and the one
// mark that follow it) then carries a few events instead of one or two,
// for at most busyPollCoalesce of added latency; under load the reads come
// as often as before.
const (
	lingerFor        = 250 * time.Millisecond
	busyPollInterval = 2 * time.Millisecond
	busyPollCoalesce = 4 * time.Millisecond
	busyPollFull     = 16
)

// busyPollPause is how long pollBusy waits after a read that found rows.
func busyPollPause(rows int) time.Duration {
	if rows >= busyPollFull {
		return busyPollInterval
	}
	return busyPollCoalesce
}

// walCoalesce is how long, while the WAL capture is busy, a publish batch of
// fewer than busyPollFull events waits for more (walSession.gather): as
// long as the table capture's busy poll waits after a short read.
func (r *engine) walCoalesce() time.Duration {
	if d := r.cfg.hooks.walCoalesce; d > 0 {
		return d
	}
	return busyPollCoalesce
}

// roundWait returns how long the marker holds a poll round's first mark for
// the others.
func (r *engine) roundWait() time.Duration {
	if d := r.cfg.hooks.roundWait; d > 0 {
		return d
	}
	return roundWait
}

// lingerFor returns how long a worker that found rows lingers.
func (r *engine) lingerFor() time.Duration {
	if d := r.cfg.hooks.lingerFor; d > 0 {
		return d
	}
	return lingerFor
}

// lingerMinRows is how many rows the engine's workers must have read in the
// last one to two lingerFor windows for a worker to linger (20 to 40 events
// a second at the default lingerFor). pollBusy costs a statement every few
// milliseconds however few rows it finds; an arming a few statements per
// partition gone idle. Below that rate polling costs more statements per
// event than arming, and a relay serving many databases at a trickle each
// polled every one of them without pause (10 databases at 10 events a
// second each: PostgreSQL busy 0.96 CPU-seconds a second, against 0.25 with
// the trickle's workers arming). A worker of a quiet engine arms at once, and
// the notification wakes it within a millisecond or two.
const lingerMinRows = 10

// busyLately reports whether the engine read enough rows lately for its workers
// to linger.
func (r *engine) busyLately(now time.Time) bool {
	least := lingerMinRows
	if n := r.cfg.hooks.lingerMinRows; n > 0 {
		least = n
	}
	return r.recent.rows(now, r.lingerFor()) >= least
}

// rowMeter counts rows in windows: rows reports those of the current window
// and the one before it.
type rowMeter struct {
	mu        sync.Mutex
	start     time.Time // of the current window
	cur, prev int
}

// add counts n rows read at now.
func (m *rowMeter) add(n int, now time.Time, window time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.roll(now, window)
	m.cur += n
}

// rows returns the rows counted in the current window and the one before.
func (m *rowMeter) rows(now time.Time, window time.Duration) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.roll(now, window)
	return m.cur + m.prev
}

func (m *rowMeter) roll(now time.Time, window time.Duration) {
	switch d := now.Sub(m.start); {
	case d < window:
	case d < 2*window:
		m.prev, m.cur, m.start = m.cur, 0, m.start.Add(window)
	default:
		m.prev, m.cur, m.start = 0, 0, now
	}
}

// lingerClaimed is worker.lingerUntil while pollBusy reads the worker's
// partition for it.
const lingerClaimed = -1

// polled is a batch pollBusy read for a lingering worker. readStart is when
// the read was sent, as readBatch's: the rows' DbNow is no earlier. round
// is the read's batches, whose marks the marker sends together.
type polled struct {
	rows      []db.PendingBatchRow
	readStart time.Time
	round     *pollRound
}

// pollRound is the batches one pollBusy read handed to workers. The marker
// holds the first of their marks until each of the round's workers has
// handed its own mark over or given its batch up (arrive), for at most
// roundWait, so that one statement marks the round: the workers publish at
// the same time, and their marks otherwise went out as two statements or
// more (the first alone, the others queued behind it).
type pollRound struct {
	left atomic.Int32
	all  chan struct{} // closed when every batch arrived
	hold time.Duration // how long the first mark waits for the others
}

// roundWait bounds how long the marker holds a round's first mark for the
// others (a slow publish, a worker stopping).
const roundWait = 2 * time.Millisecond

func newPollRound(n int, hold time.Duration) *pollRound {
	p := &pollRound{all: make(chan struct{}), hold: hold}
	p.left.Store(int32(n))
	return p
}

// arrive records that one of the round's batches was marked or given up;
// each batch arrives once. A nil round is no round.
func (p *pollRound) arrive() {
	if p != nil && p.left.Add(-1) == 0 {
		close(p.all)
	}
}

// wait waits until every batch of the round arrived or its hold passed.
func (p *pollRound) wait() {
	if p == nil {
		return
	}
	t := time.NewTimer(p.hold)
	defer t.Stop()
	select {
	case <-p.all:
	case <-t.C:
	}
}

// pollBusy reads, every busyPollInterval while any worker lingers, the next
// batch of every lingering partition in one statement (PendingBatchMany) and
// hands each worker its rows. It first claims the workers (lingerUntil from
// its deadline to lingerClaimed): a claimed worker does not read its
// partition. Once the statement has returned, pollBusy hands each claimed
// worker that has rows its batch, and gives the others their linger back
// (lingerUntil to its deadline again), so that the next round reads them
// too. It costs nothing while no partition has had rows in the last
// lingerFor.
func (r *engine) pollBusy(ctx context.Context) {
	var claimed []claim
	var parts []int32
	for ctx.Err() == nil {
		now := time.Now().UnixNano()
		claimed, parts = claimed[:0], parts[:0]
		r.mu.Lock()
		for p, w := range r.workers {
			if u := w.lingerUntil.Load(); u > now && !w.stopping() && w.lingerUntil.CompareAndSwap(u, lingerClaimed) {
				claimed = append(claimed, claim{w: w, until: u})
				parts = append(parts, p)
			}
		}
		r.mu.Unlock()
		if len(claimed) == 0 {
			select {
			case <-ctx.Done():
				return
			case <-r.busy:
			}
			continue
		}
		rows, err := r.readLingering(ctx, claimed, parts)
		if err != nil && ctx.Err() == nil {
			// The lingering workers read on their own at the end of
			// their linger.
			r.log.Debug("reading busy partitions failed", slog.Any("error", err))
			wait.Sleep(ctx, lingerFor)
			continue
		}
		wait.Sleep(ctx, busyPollPause(rows))
	}
}

// claim is a lingering worker pollBusy claimed, and its linger deadline.
type claim struct {
	w     *worker
	until int64
}

// readLingering reads the next batch of each claimed worker's partition
// (parts[i] is claimed[i]'s) in one statement, hands each worker with rows
// its batch, and gives the others (all of them when the read failed) their
// linger back. It returns the number of rows read.
func (r *engine) readLingering(ctx context.Context, claimed []claim, parts []int32) (int, error) {
	byPart := make(map[int32][]db.PendingBatchRow, len(parts))
	if h := r.cfg.hooks.pollStart; h != nil {
		h()
	}
	readStart := time.Now()
	afters := make([]int64, len(claimed))
	for i, c := range claimed {
		afters[i] = r.floorStart(c.w, readStart)
	}
	qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	rows, err := r.q.PendingBatchMany(qctx, r.cfg.Pool, db.PendingBatchManyParams{Partitions: parts, Afters: afters, BatchSize: int32(r.cfg.BatchSize)})
	cancel()
	took := time.Since(readStart)
	if err == nil {
		for _, row := range rows {
			byPart[row.Partition] = append(byPart[row.Partition], db.PendingBatchRow{
				ID: row.ID, EventID: row.EventID, Topic: row.Topic, Key: row.Key, EventType: row.EventType,
				Payload: row.Payload, Headers: row.Headers, OccurredAt: row.OccurredAt, CreatedAt: row.CreatedAt,
				KeySeq: row.KeySeq, ExpiresAt: row.ExpiresAt, Traceparent: row.Traceparent, Tracestate: row.Tracestate,
				Sent: row.Sent, DbNow: row.DbNow, SnapshotXmin: row.SnapshotXmin, Waiting: row.Waiting,
			})
		}
		if h := r.cfg.hooks.pollRead; h != nil {
			h(parts, len(rows))
		}
	}
	var round *pollRound
	if len(byPart) > 1 {
		round = newPollRound(len(byPart), r.roundWait())
	}
	for i, c := range claimed {
		got := byPart[parts[i]]
		if err == nil {
			c.w.floor.read(afters[i], took, got, nil)
			if h := r.cfg.hooks.afterRead; h != nil {
				h(parts[i], len(got))
			}
		}
		if len(got) > 0 {
			// Never blocks: the worker stays claimed until it takes its
			// batch, so it holds at most one.
			c.w.handoff <- polled{rows: got, readStart: readStart, round: round}
			continue
		}
		c.w.lingerUntil.Store(c.until)
		select {
		case c.w.released <- struct{}{}:
		default:
		}
	}
	if err != nil {
		return 0, fmt.Errorf("read pending rows of %d partitions: %w", len(parts), err)
	}
	return len(rows), nil
}

// linger leaves w to pollBusy until until, a nudge or w's end, and returns
// the batch pollBusy read and handed to it, or nil (the worker then reads on
// its own). When the linger ends while pollBusy reads for the worker, the
// worker waits for the batch or its linger back (within a QueryTimeout;
// at once at shutdown, when the read is cancelled). A stopping worker
// returns nil, dropping any rows handed to it: a worker stopped (its lease
// lost, say) while pollBusy read its partition never publishes them.
func (r *engine) linger(w *worker, until time.Time) *polled {
	u := until.UnixNano()
	w.lingerUntil.Store(u)
	select {
	case r.busy <- struct{}{}:
	default:
	}
	take := func(got polled) *polled {
		w.lingerUntil.Store(0)
		if w.stopping() {
			got.round.arrive()
			return nil
		}
		return &got
	}
	// The linger ends only with a batch, a nudge, its deadline or the
	// worker's end: pollBusy giving the linger back after an empty read
	// (released) does not wake the worker, which would otherwise wake after
	// every poll of its idle partition. A release token left over from
	// those polls only makes the loop below try its swap once more.
	t := time.NewTimer(time.Until(until))
	defer t.Stop()
	var handed *polled
	select {
	case <-w.ctx.Done():
	case <-w.wake:
	case <-t.C:
	case got := <-w.handoff:
		handed = &got
	}
	if h := r.cfg.hooks.lingerWoke; h != nil {
		h(w.partition)
	}
	if handed != nil {
		return take(*handed)
	}
	for !w.lingerUntil.CompareAndSwap(u, 0) {
		// Claimed: pollBusy is reading for w.
		select {
		case got := <-w.handoff:
			return take(got)
		case <-w.released:
		}
	}
	return nil
}

// idleSafety bounds, in PollIntervals, an idle worker's sleep that no
// notification, sweep or due row ends: a fallback only, sweepIdle polls for
// the idle workers.
const idleSafety = 60

// sweepIdle polls the idle partitions: every PollInterval (jittered) one
// statement, SweepIdle, for every worker asleep in its idle wait
// (worker.idle), instead of each worker reading its partition (PendingBatch)
// and its next due time (NextDue) every PollInterval on its own: an idle
// relay of 16 partitions sent 32 statements a second, one relay serving k
// databases 32k. The poll finds what no notification announced: a row of a
// transaction that outlived arm's wait, a row requeued by hand, a delayed
// row inserted without a notification (or any row, with NoListen).
func (r *engine) sweepIdle(ctx context.Context) {
	for wait.Sleep(ctx, wait.Jitter(r.cfg.PollInterval, jitterSpread)) {
		r.sweepOnce(ctx)
	}
}

// sweepOnce runs one SweepIdle over the idle workers and nudges those whose
// partition a claim would find rows in; one whose delayed row falls due
// before the next sweep is nudged at its due time. A probe from the start
// of the partition (its scan floor due for a full scan) that finds a row
// makes the worker's next claim start from the start too: the row may lie
// below the floor (a requeue). A failed sweep nudges every idle worker: each
// then reads its partition on its own.
func (r *engine) sweepOnce(ctx context.Context) {
	now := time.Now()
	var idle []*worker
	var parts []int32
	var afters []int64
	r.mu.Lock()
	for p, w := range r.workers {
		if !w.idle.Load() {
			continue
		}
		var after int64
		if r.floorReady.Load() && !r.cfg.hooks.floorOff {
			after = w.floor.start(now)
		}
		idle, parts, afters = append(idle, w), append(parts, p), append(afters, after)
	}
	r.mu.Unlock()
	if len(idle) == 0 {
		return
	}
	qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	rows, err := r.q.SweepIdle(qctx, r.cfg.Pool, db.SweepIdleParams{Partitions: parts, Afters: afters})
	cancel()
	if h := r.cfg.hooks.sweep; h != nil {
		h(parts)
	}
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("polling the idle partitions failed; each reads its own", slog.Any("error", err))
		}
		for _, w := range idle {
			w.nudge()
		}
		return
	}
	for _, row := range rows {
		i := slices.Index(parts, row.Partition)
		if i < 0 {
			continue
		}
		w := idle[i]
		switch due := time.Duration(row.DueInUs) * time.Microsecond; {
		case row.Ready:
			if afters[i] == 0 {
				w.floor.rescan()
			}
			w.nudge()
		case row.DueInUs >= 0 && due < r.cfg.PollInterval:
			// A millisecond past the due time, so that the claim's now()
			// has passed it.
			time.AfterFunc(due+time.Millisecond, w.nudge)
		}
	}
}

// idleWait is a worker's wait with nothing to do: until a nudge (a
// notification, sweepIdle), its partition's earliest delayed row falls due
// (idleFor) or the worker ends. It reports whether a nudge ended it.
func (r *engine) idleWait(w *worker, log *slog.Logger) bool {
	d := r.idleFor(w, log)
	w.idle.Store(true)
	defer w.idle.Store(false)
	return r.sleepOrWake(w, d)
}

// sleepOrWake waits for d, a nudge or the worker's end. It reports whether a
// nudge ended the wait.
func (r *engine) sleepOrWake(w *worker, d time.Duration) bool {
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
func (r *engine) arm(w *worker) (nudged bool, err error) {
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
