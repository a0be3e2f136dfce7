package relay

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/pgrelay/pgrelay/internal/wait"
)

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
