package inbox

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/pgrelay/pgrelay/internal/db"
)

// Applied is what ApplyStored applied inside the caller's transaction. Call
// Committed after that transaction commits: only then are the events
// processed, and only then are they reported.
type Applied struct {
	w        *Worker
	evs      []*Event
	durs     []time.Duration
	released []string
}

// Len is the number of events applied.
func (a *Applied) Len() int {
	if a == nil {
		return 0
	}
	return len(a.evs)
}

// Committed reports the applied events (the observer's Claimed and
// Processed, as a worker's batch would) and wakes the events deferred on
// dependencies the handlers released. Call it once, after the transaction
// given to ApplyStored committed; never after a rollback.
func (a *Applied) Committed(ctx context.Context) {
	if a.Len() == 0 {
		return
	}
	a.w.cfg.Observer.Claimed(len(a.evs), 0)
	for i, ev := range a.evs {
		a.w.report(result{ev: ev, processed: true, dur: a.durs[i]})
	}
	if len(a.released) > 0 {
		a.w.wakeReleased(ctx, a.released, true)
	}
}

// Idle reports whether none of the worker's goroutines is processing a
// batch: whatever it would claim next, it would claim at once.
func (w *Worker) Idle() bool { return w.busy.Load() == 0 }

// ApplyStored runs the handler on the events that tx itself has just stored
// with Receive (stored: ReceiveResult.Stored; rows of other handlers and
// dead rows are skipped) and marks them processed, all inside tx: receiving
// an event and applying it then take one transaction instead of three (store,
// claim, process), and no worker ever claims it.
//
// It is all or nothing, inside a savepoint: when any handler fails, defers or
// panics, or a mark does not match, the savepoint is rolled back and
// ApplyStored returns (nil, nil). The rows are then pending as if ApplyStored
// had not been called, and the caller wakes the workers, which run them with
// the usual claims, retries and dead letters after the commit; the failed
// attempt here is not counted (its effects were rolled back). An error is
// returned only when the savepoint itself cannot be rolled back: tx is then
// unusable and the caller must roll it back.
//
// An ordered worker (Config.Ordered) applies nothing here: its claims keep
// each key's sequence. Nor does a worker whose handler has effects outside
// the database (ExternalHandler): a failure here would roll back the calls
// that succeeded, and the workers would make them again.
//
// Nothing of this is visible to any other session before tx commits, so no
// worker can claim these rows meanwhile, and a crash before the commit loses
// nothing the broker does not redeliver.
func (w *Worker) ApplyStored(ctx context.Context, tx pgx.Tx, stored []StoredRow) (*Applied, error) {
	if w.cfg.Ordered {
		// A key's events apply in sequence, after the ones before them:
		// that is the ordered claim's work (ordered.go), not done here.
		return nil, nil
	}
	if external(w.cfg.Handler) {
		// An effect outside the database is not undone by rolling back:
		// the workers commit each event on its own (ExternalHandler).
		return nil, nil
	}
	keys := make([]string, 0, len(stored))
	for _, s := range stored {
		if s.Handler == w.cfg.HandlerName {
			keys = append(keys, s.DedupKey)
		}
	}
	if len(keys) == 0 {
		return nil, nil
	}
	sp, err := tx.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("inbox: apply stored: savepoint: %w", err)
	}
	a, reason := w.applyStored(ctx, sp, keys)
	if reason == "" {
		// The savepoint stays open rather than released: tx's commit
		// commits it with everything else, and a RELEASE is one more round
		// trip per batch for nothing.
		return a, nil
	}
	w.log.Debug("applying stored events in their receiving transaction failed; the workers run them",
		zap.Int("events", len(keys)), zap.String("reason", reason))
	if err := sp.Rollback(ctx); err != nil {
		return nil, fmt.Errorf("inbox: apply stored: roll back savepoint: %w", err)
	}
	return nil, nil
}

// applyStored does ApplyStored's work in sp and says why it did not
// complete, or "" when it did.
func (w *Worker) applyStored(ctx context.Context, sp pgx.Tx, keys []string) (*Applied, string) {
	started := time.Now()
	rows, err := w.q.SelectInboxStored(ctx, sp, db.SelectInboxStoredParams{Handler: w.cfg.HandlerName, DedupKeys: keys})
	if err != nil {
		return nil, "read: " + err.Error()
	}
	if len(rows) != len(keys) {
		return nil, fmt.Sprintf("read %d of %d stored rows", len(rows), len(keys))
	}
	evs := make([]*Event, 0, len(rows))
	keys = keys[:0]
	for _, r := range rows {
		if r.Status != "pending" {
			continue // stored dead (malformed)
		}
		// The attempt this run makes, and the fencing version the mark
		// gives it, as a claim would have set them.
		ev := newEvent(r.EventID, r.Topic, r.Key, r.EventType, r.Payload, r.Headers, r.OccurredAt, r.ReceivedAt,
			r.Attempts+1, r.Deferrals, r.LockVersion+1, r.LastError)
		ev.Handler, ev.DedupKey = r.Handler, r.DedupKey
		evs = append(evs, &ev)
		keys = append(keys, r.DedupKey)
	}
	if len(evs) == 0 {
		return nil, ""
	}
	// In arrival order, as a claim runs them.
	slices.SortStableFunc(evs, arrivalOrder)
	released := &releaseSet{}
	hctx := withReleaseSet(ctx, released)
	durs := make([]time.Duration, len(evs))
	if bh, ok := w.cfg.Handler.(BatchHandler); ok && len(evs) > 1 {
		if expiredEvents(evs, time.Now()) != nil {
			return nil, "an event expired" // the worker marks it dead
		}
		start := time.Now()
		if herr := w.callBatchHandler(hctx, sp, bh, evs); herr != nil {
			return nil, "batch handler: " + herr.Error()
		}
		per := time.Since(start) / time.Duration(len(evs))
		for i := range durs {
			durs[i] = per
		}
	} else {
		for i, ev := range evs {
			start := time.Now()
			if herr := w.callHandler(hctx, sp, ev); herr != nil {
				return nil, "handler: " + herr.Error()
			}
			durs[i] = time.Since(start)
		}
	}
	marked, err := w.q.MarkInboxStoredProcessed(ctx, sp, db.MarkInboxStoredProcessedParams{
		WorkerID: w.cfg.WorkerID, StartedAt: started, Handler: w.cfg.HandlerName, DedupKeys: keys,
	})
	if err != nil {
		return nil, "mark: " + err.Error()
	}
	if len(marked) != len(keys) {
		return nil, fmt.Sprintf("marked %d of %d", len(marked), len(keys))
	}
	return &Applied{w: w, evs: evs, durs: durs, released: released.taken()}, ""
}
