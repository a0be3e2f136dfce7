package relay

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgrelay/pgrelay/internal/db"
	"github.com/pgrelay/pgrelay/internal/wait"
)

// worker publishes one leased partition.
type worker struct {
	partition int32
	epoch     int64
	// sess is the lock session the lease is held under (nil: lease only): a
	// batch is published only while it is valid.
	sess *lockSession
	// leaseUntil is when the lease ends at the latest, as a duration since
	// engine.clock: a batch is published only before it.
	leaseUntil atomic.Int64
	// lingerUntil (UnixNano) is when the worker, idle after finding rows,
	// stops relying on pollBusy and arms the partition's wake-up; 0: not
	// lingering; lingerClaimed: pollBusy is reading the partition for the
	// worker, which does not read it meanwhile.
	lingerUntil atomic.Int64
	// handoff carries the batch pollBusy read for the lingering worker;
	// released tells it that pollBusy gave its linger back (read nothing),
	// which only a worker waiting for pollBusy at its linger's end heeds.
	handoff  chan polled
	released chan struct{}
	ctx      context.Context // cancelled to stop between batches
	cancel   context.CancelFunc
	release  bool // set before cancel: release the lease when done
	wake     chan struct{}
	done     chan struct{}
	// floor is where the partition's claims start their scan.
	floor scanFloor
	// idle is set while the worker waits with nothing to do (idleWait):
	// sweepIdle polls its partition for it.
	idle atomic.Bool
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
// gives its lease up. Called with engine.mu held.
func (w *worker) stop(release bool) {
	if w.ctx.Err() == nil {
		w.release = release
		w.cancel()
	}
}

// startWorker starts publishing partition p at epoch, leased under s (nil:
// lease only). Called without r.mu.
func (r *engine) startWorker(parent context.Context, p int32, epoch int64, leaseUntil time.Duration, s *lockSession) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(parent))
	w := &worker{partition: p, epoch: epoch, sess: s, ctx: ctx, cancel: cancel, wake: make(chan struct{}, 1), handoff: make(chan polled, 1), released: make(chan struct{}, 1), done: make(chan struct{})}
	w.leaseUntil.Store(int64(leaseUntil))
	w.floor.fullEvery, w.floor.maxEvery = r.cfg.hooks.floorFullEvery, r.cfg.hooks.floorFullEvery
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
				r.log.Warn("release lease", slog.Any("partition", p), slog.Any("error", err))
			}
		}
		r.mu.Lock()
		if r.workers[p] == w {
			delete(r.workers, p)
		}
		r.mu.Unlock()
	}()
}

// workSafely runs the worker, turning a panic (in an Observer, say) into the
// worker's end: the lease stays held, and the next heartbeat starts a new
// worker for it.
func (r *engine) workSafely(w *worker) {
	defer func() {
		if p := recover(); p != nil {
			r.log.Error("partition worker panicked; restarting it at the next heartbeat", slog.Any("partition", w.partition), slog.Any("panic", p))
			w.cancel()
		}
	}()
	r.work(w)
}

func (r *engine) work(w *worker) {
	log := r.log.With(slog.Any("partition", w.partition), slog.Int64("epoch", w.epoch))
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
	// handed is the batch pollBusy read for the worker while it lingered;
	// runBatch marks it or gives it up, and so does the worker's end.
	var handed *polled
	defer func() {
		if handed != nil {
			handed.round.arrive()
		}
	}()
	for w.ctx.Err() == nil {
		n, err := r.runBatch(w, log, bo, inflight, handed)
		handed = nil
		if err == nil && n < r.cfg.BatchSize {
			err = r.awaitMark(w, log, inflight)
		}
		switch {
		case errors.Is(err, errFenced), w.sess.over():
			// Fenced, or its lock session ended: nothing of this lease is
			// published any more (the next session releases it).
			w.cancel()
			return
		case err != nil:
			if errors.Is(r.awaitMark(w, log, inflight), errFenced) {
				w.cancel()
				return
			}
			d := bo.Last()
			log.Warn("publishing failed; the partition backs off and retries in order", slog.Any("error", err), slog.Duration("backoff", d))
			wait.Sleep(w.ctx, d)
			continue
		}
		bo.Reset()
		if n > 0 {
			armed = false // a notification may have been spent on these rows
			lastRows = time.Now()
			r.recent.add(n, lastRows, r.lingerFor())
		}
		if n == r.cfg.BatchSize {
			continue
		}
		if !armed {
			// Rows came within the last lingerFor, and the engine is busy:
			// stay awake and let pollBusy look for more every
			// busyPollInterval instead of arming. A producer whose insert
			// finds its partition armed notifies, and PostgreSQL serializes
			// notifying commits (including their WAL flush): under a steady
			// stream of small transactions, re-arming after every batch
			// made nearly every producer commit notify, one at a time.
			if now, until := time.Now(), lastRows.Add(r.lingerFor()); now.Before(until) && r.busyLately(now) {
				// A lingering worker has no mark in flight: it follows a
				// batch smaller than BatchSize, whose mark was awaited
				// above, so pollBusy reads for it excluding nothing. Were a
				// mark ever in flight here, the worker would sleep instead.
				if inflight.done == nil {
					handed = r.linger(w, until)
				} else {
					r.sleepOrWake(w, time.Until(until))
				}
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
					log.Warn("arming the partition's wake-up failed; polling", slog.Any("error", err))
				}
			case nudged:
				continue // the notification disarmed the partition
			default:
				armed = true
				continue // look again: rows committed while arming
			}
		}
		if r.idleWait(w, log) {
			armed = false // a notification may have disarmed the partition
		}
	}
}

// idleFor returns how long an idle worker sleeps: until its partition's
// earliest delayed row falls due (one probe of the pending index, NextDue),
// at most idleSafety PollIntervals; sweepIdle polls the partition meanwhile.
// A row due far in the future thus costs nothing while it waits: no claim
// reads it.
func (r *engine) idleFor(w *worker, log *slog.Logger) time.Duration {
	d := idleSafety * r.cfg.PollInterval
	qctx, cancel := context.WithTimeout(w.ctx, r.cfg.QueryTimeout)
	dueUs, err := r.q.NextDue(qctx, r.cfg.Pool, w.partition)
	cancel()
	switch {
	case err != nil:
		if w.ctx.Err() == nil {
			log.Warn("reading the partition's next due time failed; polling", slog.Any("error", err))
		}
	case dueUs >= 0:
		// A millisecond past the due time, so that the claim's now() has
		// passed it.
		d = min(d, time.Duration(dueUs)*time.Microsecond+time.Millisecond)
	}
	return d
}
