package pgrelay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgrelay/pgrelay/internal/db"
)

// Applied is what ReceiveApply applied inside the caller's transaction. Call
// Committed after that transaction commits: only then are the events
// processed, and only then are they reported.
type Applied struct {
	w        *InboxWorker
	evs      []*InboxEvent
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
// given to ReceiveApply committed; never after a rollback.
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

// applySavepoint is the savepoint ReceiveApply takes before its insert.
const applySavepoint = "pgrelay_apply_on_receive"

// ReceiveApply stores msgs in tx as ReceiveWith does and applies, in tx too,
// the rows it stores for the worker's handler: receiving an event and
// applying it then take one transaction instead of three (store, claim,
// process), and no worker ever claims it. observe, when not nil, is given the
// duration of each store (ReceiveWith's work).
//
// The insert itself stores those rows processed, as a claim and a mark would
// leave them after one attempt, and returns them as a claim does: the handler
// sees the InboxEvent a worker's claim would give it (Attempts 1, LockVersion 1).
// Only the worker's handler's live rows are applied; other handlers' rows and
// rows stored dead are stored as ReceiveWith stores them. A savepoint taken
// just before the insert, sent with it in one round trip, makes it all or
// nothing: when any handler fails, defers or panics, an event expired, or a
// handler left the transaction aborted (a statement error it swallowed),
// ReceiveApply rolls back to the savepoint (the processed rows, the handlers'
// effects, the duplicates recorded and the batch counted go with it) and
// stores the batch again as ReceiveWith does, pending, with no Applied. The
// caller wakes the workers, which run the rows with the usual claims, retries
// and dead letters after the commit; the failed run here is not counted as
// an attempt (its effects were rolled back). A successful apply costs BEGIN,
// this one round trip, the handlers' statements and COMMIT. An error means
// tx is unusable and the caller must roll it back.
//
// An ordered worker (InboxConfig.Ordered) applies nothing here: its claims keep
// each key's sequence. Nor does a worker whose handler has effects outside
// the database (ExternalHandler): a failure here would roll back the calls
// that succeeded, and the workers would make them again. Both just store.
//
// Nothing of this is visible to any other session before tx commits, so no
// worker can claim these rows meanwhile, and a crash before the commit loses
// nothing the broker does not redeliver. Call it for first deliveries only
// (the consumer's rule): a message whose handler kills the process here comes
// back as a redelivery, stored for the workers' counted claims.
func (w *InboxWorker) ReceiveApply(ctx context.Context, tx pgx.Tx, msgs []Incoming, opts ReceiveOptions,
	observe func(time.Duration)) (ReceiveResult, *Applied, error) {
	po, err := opts.parse()
	if err != nil {
		return ReceiveResult{}, nil, err
	}
	store := func(sp storedProcessed, q db.DBTX) (ReceiveResult, []db.InsertInboxRow, error) {
		start := time.Now()
		res, rows, err := receive(ctx, q, msgs, po, sp)
		if observe != nil {
			observe(time.Since(start))
		}
		return res, rows, err
	}
	if w.cfg.Ordered || external(w.cfg.Handler) {
		// Ordered: a key's events apply in sequence, after the ones before
		// them (ordered.go). External: an effect outside the database is
		// not undone by rolling back; the workers commit each event on its
		// own (ExternalHandler).
		res, _, err := store(storedProcessed{}, tx)
		return res, nil, err
	}
	sp := storedProcessed{handler: w.cfg.HandlerName, workerID: w.cfg.WorkerID, started: time.Now()}
	res, rows, err := store(sp, &savepointFirst{Tx: tx})
	if err != nil {
		return ReceiveResult{}, nil, err
	}
	a, reason := w.applyInserted(ctx, tx, rows)
	if reason == "" {
		// The savepoint stays open rather than released: tx's commit
		// commits it with everything else, and a RELEASE is one more round
		// trip per batch for nothing.
		return res, a, nil
	}
	w.log.Debug("applying stored events in their receiving transaction failed; the workers run them",
		slog.Int("events", a.Len()), slog.String("reason", reason))
	if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+applySavepoint); err != nil {
		return ReceiveResult{}, nil, fmt.Errorf("inbox: apply on receive: roll back savepoint: %w", err)
	}
	res, _, err = store(storedProcessed{}, tx)
	return res, nil, err
}

// applyInserted runs the handler, in tx, on the rows of rows the insert
// stored processed for the worker's handler, and says why it did not
// complete, or "" when it did. When it did not, the Applied returned only
// counts the events for the log.
func (w *InboxWorker) applyInserted(ctx context.Context, tx pgx.Tx, rows []db.InsertInboxRow) (*Applied, string) {
	var evs []*InboxEvent
	for _, r := range rows {
		if r.Status != "processed" || r.Handler != w.cfg.HandlerName {
			continue // another handler's, or stored dead (malformed)
		}
		// Built as a claim builds it (fromClaimRow), from what the insert
		// stored: the attempt and fencing version a claim would give.
		ev := newEvent(r.EventID, r.Topic, r.Key, r.EventType, r.AppliedPayload, r.AppliedHeaders, r.OccurredAt, r.ReceivedAt,
			r.Attempts, r.Deferrals, r.LockVersion, r.LastError)
		ev.Handler, ev.DedupKey = r.Handler, r.DedupKey
		ev.KeySeq = seqOf(r.KeySeq)
		evs = append(evs, &ev)
	}
	if len(evs) == 0 {
		return nil, ""
	}
	a := &Applied{w: w, evs: evs}
	// In arrival order, as a claim runs them.
	slices.SortStableFunc(evs, arrivalOrder)
	released := &releaseSet{}
	hctx := withReleaseSet(ctx, released)
	durs := make([]time.Duration, len(evs))
	if bh, ok := w.cfg.Handler.(InboxBatchHandler); ok && len(evs) > 1 {
		if expiredEvents(evs, time.Now()) != nil {
			return a, "an event expired" // the worker marks it dead
		}
		start := time.Now()
		if herr := w.callBatchHandler(hctx, tx, bh, evs); herr != nil {
			return a, "batch handler: " + herr.Error()
		}
		per := time.Since(start) / time.Duration(len(evs))
		for i := range durs {
			durs[i] = per
		}
	} else {
		for i, ev := range evs {
			start := time.Now()
			if herr := w.callHandler(hctx, tx, ev); herr != nil {
				return a, "handler: " + herr.Error()
			}
			durs[i] = time.Since(start)
		}
	}
	if tx.Conn().PgConn().TxStatus() == 'E' {
		// A handler swallowed the error of a statement that aborted the
		// transaction: the commit would roll back the whole store. Known
		// from the last reply's status, without a round trip.
		return a, "a handler left the transaction aborted"
	}
	a.durs, a.released = durs, released.taken()
	return a, ""
}

// savepointFirst is a transaction that sends a SAVEPOINT (applySavepoint)
// ahead of its first query, in the same round trip (one pgx batch).
type savepointFirst struct {
	pgx.Tx
	sent bool
}

func (s *savepointFirst) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if s.sent {
		return s.Tx.Query(ctx, sql, args...)
	}
	s.sent = true
	b := &pgx.Batch{}
	b.Queue("SAVEPOINT " + applySavepoint)
	b.Queue(sql, args...)
	br := s.Tx.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return nil, fmt.Errorf("savepoint: %w", err)
	}
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return nil, err
	}
	return &batchRows{Rows: rows, br: br}, nil
}

func (s *savepointFirst) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if !s.sent {
		// Every statement goes through Query first (InsertInbox); an Exec
		// first would miss the savepoint.
		return pgconn.CommandTag{}, errors.New("inbox: apply on receive: the savepoint is sent with the insert")
	}
	return s.Tx.Exec(ctx, sql, args...)
}

func (s *savepointFirst) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if !s.sent {
		return errRow{errors.New("inbox: apply on receive: the savepoint is sent with the insert")}
	}
	return s.Tx.QueryRow(ctx, sql, args...)
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// batchRows are the rows of a batch's last query; closing them closes the
// batch.
type batchRows struct {
	pgx.Rows
	br     pgx.BatchResults
	closed bool
	err    error
}

func (r *batchRows) Close() {
	if r.closed {
		return
	}
	r.closed = true
	r.Rows.Close()
	r.err = r.br.Close()
}

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}
