package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/internal/db"
	"github.com/pgrelay/pgrelay/internal/event"
)

// publishBatch publishes rows while w's lease lasts and returns each row's
// result; errLeaseExpired when the lease may have ended before publishing.
// readStart is when the rows were read (see expiredRows).
func (r *engine) publishBatch(w *worker, log *slog.Logger, rows []db.PendingBatchRow, readStart time.Time) ([]broker.Result, error) {
	if h := r.cfg.hooks.beforePublish; h != nil {
		h(w.partition)
	}
	// A batch starts publishing only under a confirmed lock session (see
	// below); one that lapsed because its check is slow is waited for.
	if w.sess != nil && !w.sess.valid() {
		w.sess.await(w.ctx, lockValidFor)
	}
	results, msgs, idx := brokerMessages(rows, expiredRows(rows, readStart))
	// A relay paused past its lease (a stop-the-world pause, a suspended VM,
	// failed heartbeats) must not publish the batch it read before: another
	// relay may have taken the partition and published these rows, and once
	// the broker's duplicate window has passed they would be stored twice.
	// Publishing stops at the lease's end, too.
	leaseEnd := r.leaseEnd(w)
	if !time.Now().Before(leaseEnd) {
		log.Warn("lease may have expired; the batch read before is not published", slog.Int("rows", len(rows)))
		return nil, errLeaseExpired
	}
	// Likewise once the lock session is no longer confirmed: another relay
	// takes the partition lockValidFor after it saw the session end. A
	// batch already handed to the broker is not cancelled then (its
	// confirms may be on their way, and an event whose outcome is unknown
	// would later read as expired although the broker has it): what this
	// relay still sends is a copy of what the new owner publishes from the
	// same first pending row, in the same order, so each event's first copy
	// keeps the key's order and the rest are duplicates the broker or the
	// inbox absorbs.
	if w.sess != nil && !w.sess.valid() {
		return nil, errSessionLapsed
	}
	if len(msgs) > 0 {
		start := time.Now()
		for j, res := range r.publish(msgs, leaseEnd) {
			results[idx[j]] = res
		}
		r.cfg.obs.PublishDuration(int(w.partition), len(msgs), time.Since(start))
	}
	return results, nil
}

// errExpired is the result of a row whose expires_at passed before it was
// published: it is marked dead with the reason "expired".
var errExpired = broker.Terminal(errors.New(event.ReasonExpired))

// expiredRows reports which rows have expired by now, on the database's
// clock: each row's DbNow (the read's now()) plus the time since readStart,
// which is no less than the time since the read's now() was taken. The
// estimate errs towards later, so a row is never published after its
// expires_at; it may be marked expired up to the read's round trip early. A
// row sent already (Sent: a relay noted it before handing it to the broker,
// see noteSending) is not expired: whether the broker holds it is unknown,
// so it is published again and marked published.
func expiredRows(rows []db.PendingBatchRow, readStart time.Time) []bool {
	var expired []bool
	since := time.Since(readStart)
	for i, row := range rows {
		if row.ExpiresAt == nil || row.Sent || row.DbNow.Add(since).Before(*row.ExpiresAt) {
			continue
		}
		if expired == nil {
			expired = make([]bool, len(rows))
		}
		expired[i] = true
	}
	return expired
}

// noteSending records on the rows that expire, before any is handed to the
// broker, that they are being sent (NoteSending): once the broker may hold
// a row, no relay marks it dead as expired, not this one after a failed
// mark nor another after a fenced one. Rows noted already, and those
// expired by now (marked dead without publishing), are left alone; a batch
// without expiring rows costs nothing. errFenced when the partition has
// another owner: nothing is published.
func (r *engine) noteSending(w *worker, rows []db.PendingBatchRow, readStart time.Time) error {
	expired := expiredRows(rows, readStart)
	var ids []int64
	for i, row := range rows {
		if row.ExpiresAt != nil && !row.Sent && (expired == nil || !expired[i]) {
			ids = append(ids, row.ID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	qctx, cancel := context.WithTimeout(context.Background(), r.cfg.QueryTimeout)
	held, err := r.q.NoteSending(qctx, r.cfg.Pool, db.NoteSendingParams{Partition: w.partition, Owner: r.cfg.NodeID, Epoch: w.epoch, Ids: ids})
	cancel()
	if err != nil {
		return fmt.Errorf("note %d expiring rows as sent: %w", len(ids), err)
	}
	if !held {
		r.cfg.obs.Fenced(int(w.partition))
		return errFenced
	}
	return nil
}

// brokerMessages returns the messages to publish for rows (msgs[j] is
// rows[idx[j]]) and a result per row, already failed for the rows that
// cannot be published: expired ones (expired[i], nil for none) and those
// whose headers cannot be carried.
func brokerMessages(rows []db.PendingBatchRow, expired []bool) (results []broker.Result, msgs []pgrelay.Message, idx []int) {
	// Rows whose headers cannot be carried are dead before publishing.
	results = make([]broker.Result, len(rows))
	msgs = make([]pgrelay.Message, 0, len(rows))
	idx = make([]int, 0, len(rows))
	for i, row := range rows {
		if expired != nil && expired[i] {
			results[i].Err = errExpired
			continue
		}
		m := pgrelay.Message{EventID: row.EventID, Topic: row.Topic, Key: row.Key, EventType: row.EventType, Payload: row.Payload, OccurredAt: row.OccurredAt}
		if row.KeySeq != nil {
			m.KeySeq = *row.KeySeq
		}
		if row.ExpiresAt != nil {
			m.ExpiresAt = *row.ExpiresAt
		}
		if row.Traceparent != nil {
			m.TraceParent = *row.Traceparent
		}
		if row.Tracestate != nil {
			m.TraceState = *row.Tracestate
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
	return results, msgs, idx
}

// publish calls the Publisher until leaseEnd, turning a panic into a
// transient failure of the whole batch.
func (r *engine) publish(msgs []pgrelay.Message, leaseEnd time.Time) (results []broker.Result) {
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.PublishTimeout)
	defer cancel()
	ctx, cancelLease := context.WithDeadline(ctx, leaseEnd)
	defer cancelLease()
	defer func() {
		if p := recover(); p != nil {
			r.log.Error("publisher panicked", slog.Any("panic", p))
			results = make([]broker.Result, len(msgs))
			for i := range results {
				results[i].Err = fmt.Errorf("publisher panicked: %v", p)
			}
		}
	}()
	// The database's share of the events in flight first (gate).
	if err := r.cfg.gate.acquire(ctx, r.cfg.database, len(msgs)); err != nil {
		results = make([]broker.Result, len(msgs))
		for i := range results {
			results[i].Err = fmt.Errorf("waiting for the database's share of relay.Config.InFlightEvents: %w", err)
		}
		return results
	}
	defer r.cfg.gate.release(r.cfg.database, len(msgs))
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

// outcomes is what publishing a batch came to, row by row.
type outcomes struct {
	markIDs   []int64  // published or dead: marked
	deadIDs   []int64  // rejected permanently
	reasons   []string // why each of deadIDs was rejected
	failedIDs []int64  // failed transiently: left pending
	transient error    // the first transient failure

	published, dead, dups int // dups: published rows the broker reported as duplicates
	expired               int // rows marked dead because they expired before publishing
}

// outcomesOf sorts the batch's rows by their publishing's results.
func outcomesOf(log *slog.Logger, rows []db.PendingBatchRow, results []broker.Result) outcomes {
	// Mark every row with an outcome: published, or dead when rejected
	// permanently. Rows that failed transiently stay pending and are retried
	// after a backoff. They are always a suffix of their key's rows in the
	// batch (the publisher sends nothing of a key after its transient
	// failure), so per-key order holds while the other keys move on.
	out := outcomes{deadIDs: []int64{}, reasons: []string{}} // never NULL
	for i, res := range results {
		if res.Err != nil && !broker.IsTerminal(res.Err) {
			if out.transient == nil {
				out.transient = res.Err
			}
			out.failedIDs = append(out.failedIDs, rows[i].ID)
			continue
		}
		out.markIDs = append(out.markIDs, rows[i].ID)
		if res.Err == errExpired {
			out.deadIDs = append(out.deadIDs, rows[i].ID)
			out.reasons = append(out.reasons, event.ReasonExpired)
			out.expired++
			continue
		}
		if res.Err != nil {
			out.deadIDs = append(out.deadIDs, rows[i].ID)
			out.reasons = append(out.reasons, res.Err.Error())
			out.dead++
			log.Warn("event rejected permanently; marked dead", slog.String("event_id", rows[i].EventID), slog.Any("error", res.Err))
			continue
		}
		out.published++
		if res.Duplicate {
			out.dups++
		}
	}
	return out
}

// retryLater records a transient failure on the rows it left pending, to be
// retried after the partition's next backoff, and returns it.
func (r *engine) retryLater(w *worker, log *slog.Logger, bo *retryBackoff, rest []int64, transient error) error {
	r.cfg.obs.PublishFailed(int(w.partition), len(rest), transient)
	retryAt := time.Now().Add(bo.Next())
	bo.advanced = true
	qctx, cancel := context.WithTimeout(context.Background(), r.cfg.QueryTimeout)
	_, err := r.q.RecordPublishFailure(qctx, r.cfg.Pool, db.RecordPublishFailureParams{
		LastError: transient.Error(), NextAttemptAt: &retryAt, Ids: rest, Partition: w.partition, Owner: r.cfg.NodeID, Epoch: w.epoch,
	})
	cancel()
	if err != nil {
		log.Warn("record publish failure", slog.Any("error", err))
	}
	return fmt.Errorf("publish: %w", transient)
}
