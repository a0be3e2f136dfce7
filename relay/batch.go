package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/pgrelay/pgrelay/internal/db"
	"github.com/pgrelay/pgrelay/internal/wait"
)

// runBatch publishes the next batch of the partition (handed, when pollBusy
// read it for the worker) and marks it. It returns the number of rows read.
// A failure advances bo, so that the retry time recorded on the rows is the
// one the worker waits for.
func (r *engine) runBatch(w *worker, log *slog.Logger, bo *retryBackoff, inflight *pendingMark, handed *polled) (int, error) {
	n, err := r.runBatchOnce(w, log, bo, inflight, handed)
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
func (r *engine) awaitMark(w *worker, log *slog.Logger, m *pendingMark) error {
	if m.done == nil {
		return nil
	}
	err := <-m.done
	m.done, m.ids = nil, nil
	if err != nil && !errors.Is(err, errFenced) {
		log.Warn("marking a published batch failed; it is published again (JetStream drops the duplicates)", slog.Int("rows", m.rows), slog.Any("error", err))
	}
	return err
}

// runBatchOnce reads the next batch (past the batch whose mark is in
// flight), or takes the one pollBusy read and handed over, publishes it,
// and marks it. A full batch published without a transient failure is
// marked in the background while the worker reads and publishes the next
// one: the next batch holds only rows after it (each key's earlier rows are
// acknowledged), and its own mark waits for this one, so a fenced or failed
// mark stops the partition before anything later is marked.
func (r *engine) runBatchOnce(w *worker, log *slog.Logger, bo *retryBackoff, inflight *pendingMark, handed *polled) (int, error) {
	var rows []db.PendingBatchRow
	var readStart time.Time
	// round is the poll round of a handed batch until its mark takes it
	// over; a batch not marked through it arrives when this returns.
	var round *pollRound
	defer func() { round.arrive() }()
	if handed != nil {
		rows, readStart, round = handed.rows, handed.readStart, handed.round
	} else {
		var err error
		if rows, readStart, err = r.readBatch(w, inflight); err != nil {
			return 0, err
		}
	}
	if len(rows) == 0 {
		return 0, nil
	}
	// Noted before the standbys' wait, which then covers the note too.
	if err := r.noteSending(w, rows, readStart); err != nil {
		return len(rows), err
	}
	if err := r.awaitStandbys(w, log); err != nil {
		return len(rows), err
	}
	results, err := r.publishBatch(w, log, rows, readStart)
	if err != nil {
		return len(rows), err
	}
	ids := rowIDs(rows)
	if h := r.cfg.hooks.afterPublish; h != nil {
		h(w.partition, ids)
	}
	out := outcomesOf(log, rows, results)
	// The previous batch's mark first: this batch is marked only after it.
	if err := r.awaitMark(w, log, inflight); err != nil {
		return len(rows), err
	}
	if out.transient == nil && len(rows) == r.cfg.BatchSize && w.ctx.Err() == nil {
		inflight.start(log, ids, func() error { return r.mark(w, log, rows, out, nil) })
		return len(rows), nil
	}
	rd := round
	round = nil
	if err := r.mark(w, log, rows, out, rd); err != nil {
		return len(rows), err
	}
	if out.transient != nil {
		return len(rows), r.retryLater(w, log, bo, out.failedIDs, out.transient)
	}
	return len(rows), nil
}

// readBatch reads the partition's next pending rows, in id order, past the
// batch whose mark is in flight and from the partition's scan floor.
// readStart is when the read was sent: the rows' DbNow is no earlier than
// that instant.
func (r *engine) readBatch(w *worker, inflight *pendingMark) (rows []db.PendingBatchRow, readStart time.Time, err error) {
	exclude := inflight.ids
	if exclude == nil {
		exclude = []int64{}
	}
	readStart = time.Now()
	after := r.floorStart(w, readStart)
	qctx, cancel := context.WithTimeout(context.Background(), r.cfg.QueryTimeout)
	rows, err = r.q.PendingBatch(qctx, r.cfg.Pool, db.PendingBatchParams{Partition: w.partition, After: after, BatchSize: int32(r.cfg.BatchSize), Exclude: exclude})
	cancel()
	if err != nil {
		return nil, readStart, fmt.Errorf("read pending rows: %w", err)
	}
	w.floor.read(after, time.Since(readStart), rows, exclude)
	if h := r.cfg.hooks.afterRead; h != nil {
		h(w.partition, len(rows))
	}
	return rows, readStart, nil
}

// rowIDs returns the ids of rows, in order.
func rowIDs(rows []db.PendingBatchRow) []int64 {
	ids := make([]int64, len(rows))
	for i, row := range rows {
		ids[i] = row.ID
	}
	return ids
}

// mark records the batch's published and dead rows, fenced by w's epoch,
// through the marker, which sends it in one statement with the marks of
// other partitions handed to it meanwhile (and those of round, the poll
// round the batch came in, if any); it returns errFenced when another relay
// owns the partition now.
func (r *engine) mark(w *worker, log *slog.Logger, rows []db.PendingBatchRow, out outcomes, round *pollRound) error {
	if len(out.markIDs) == 0 {
		round.arrive()
		return nil
	}
	if h := r.cfg.hooks.beforeMark; h != nil {
		h(w.partition, out.markIDs)
	}
	res := r.marker.mark(&markRequest{
		partition: w.partition, epoch: w.epoch, ids: out.markIDs, deadIDs: out.deadIDs, reasons: out.reasons,
		async: r.cfg.AsyncMarks, round: round,
	})
	if res.err != nil {
		return fmt.Errorf("mark %d rows: %w", len(out.markIDs), res.err)
	}
	if res.marked == 0 {
		log.Warn("mark fenced: another relay owns the partition now; it republishes the batch", slog.Int("rows", len(out.markIDs)))
		r.cfg.obs.Fenced(int(w.partition))
		return errFenced
	}
	w.floor.marked(slices.Max(rowIDs(rows)), res.xid)
	if out.published > 0 {
		r.cfg.obs.Published(int(w.partition), out.published, out.dups, time.Since(rows[0].CreatedAt))
	}
	if out.dead > 0 {
		r.cfg.obs.MarkedDead(int(w.partition), out.dead)
	}
	if out.expired > 0 {
		r.cfg.obs.Expired(int(w.partition), out.expired)
	}
	return nil
}

// floorStart returns where w's claim beginning at now starts its scan (see
// scanFloor); from the start on a schema below floorSchema, and with
// Config's hook floorOff.
func (r *engine) floorStart(w *worker, now time.Time) int64 {
	var after int64
	if r.floorReady.Load() && !r.cfg.hooks.floorOff {
		after = w.floor.start(now)
	} else {
		// Nothing learnt without the floor is kept for when it is on.
		w.floor.reset()
	}
	if h := r.cfg.hooks.claimFrom; h != nil {
		h(w.partition, after)
	}
	return after
}

// start runs mark in the background as the mark of the batch of ids.
func (m *pendingMark) start(log *slog.Logger, ids []int64, mark func() error) {
	done := make(chan error, 1)
	m.done, m.ids, m.rows = done, ids, len(ids)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				// An Observer's panic, after the mark committed.
				log.Error("panic while marking a batch", slog.Any("panic", p))
				done <- fmt.Errorf("panic while marking: %v", p)
			}
		}()
		done <- mark()
	}()
}

// retryBackoff is a partition's backoff, and whether the current batch has
// already advanced it.
type retryBackoff struct {
	*wait.Backoff
	advanced bool // Next was called during the current batch
}

func (r *engine) newBackoff() *retryBackoff {
	return &retryBackoff{Backoff: wait.New(r.backoffPolicy())}
}
