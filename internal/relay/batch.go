package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/pgrelay/pgrelay/internal/broker"
	"github.com/pgrelay/pgrelay/internal/db"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/wait"
)

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

// retryBackoff is a partition's backoff, and whether the current batch has
// already advanced it.
type retryBackoff struct {
	*wait.Backoff
	advanced bool // Next was called during the current batch
}

func (r *Relay) newBackoff() *retryBackoff {
	return &retryBackoff{Backoff: wait.New(r.backoffPolicy())}
}
