package relay

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/pgrelay/pgrelay/internal/db"
)

// Polling the standbys' flush positions: the first pause, the longest, and
// how long a batch waits before the relay says so in its log.
const (
	standbyPollMin   = time.Millisecond
	standbyPollMax   = 50 * time.Millisecond
	standbyWarnAfter = 10 * time.Second
)

// awaitStandbys returns once every standby of Config.StandbyNames has
// flushed the WAL past the server's insert position read now, which is past
// the commits of the batch read before: one wait per batch. It waits as
// long as the partition's lease lasts (errLeaseExpired after it) and until
// the worker stops; nothing is published meanwhile.
func (r *engine) awaitStandbys(w *worker, log *slog.Logger) error {
	names := r.cfg.StandbyNames
	if len(names) == 0 {
		return nil
	}
	var target *string
	var since time.Time
	defer func() {
		if !since.IsZero() {
			r.cfg.obs.StandbyWait(int(w.partition), time.Time{})
		}
	}()
	pause, warned, flushed := standbyPollMin, false, false
	for {
		qctx, cancel := context.WithTimeout(context.Background(), r.cfg.QueryTimeout)
		row, err := r.q.StandbysFlushed(qctx, r.cfg.Pool, db.StandbysFlushedParams{Names: names, Target: target})
		cancel()
		if err != nil {
			return fmt.Errorf("read the standbys' flush positions: %w", err)
		}
		if int(row.Flushed) == len(names) {
			return nil
		}
		if target == nil {
			target, since = &row.Target, time.Now()
			r.cfg.obs.StandbyWait(int(w.partition), since)
		}
		if !row.FlushedHere && !flushed && pause == standbyPollMax {
			// Still unflushed here after the first polls: no commit came to
			// flush the WAL writer's partial page; commit one.
			flushed = true
			qctx, cancel := context.WithTimeout(context.Background(), r.cfg.QueryTimeout)
			err := r.q.FlushWAL(qctx, r.cfg.Pool)
			cancel()
			if err != nil {
				return fmt.Errorf("flush the WAL for the standbys: %w", err)
			}
		}
		if !warned && time.Since(since) >= standbyWarnAfter {
			warned = true
			log.Warn("publishing held: not every standby named has flushed the batch's commits (connected? see pg_stat_replication)",
				slog.Any("standby_names", names), slog.String("wal_position", *target), slog.Duration("waited", time.Since(since)))
		}
		if !time.Now().Before(r.leaseEnd(w)) {
			return errLeaseExpired
		}
		select {
		case <-w.ctx.Done():
			return fmt.Errorf("stopped while waiting for the standbys: %w", w.ctx.Err())
		case <-time.After(pause):
		}
		pause = min(2*pause, standbyPollMax)
	}
}

// checkStandbys refuses to start when Config.StandbyNames is set and the
// role cannot see pg_stat_replication's LSN columns (every batch would wait
// for ever), and logs the standbys connected now.
func (r *engine) checkStandbys(ctx context.Context) error {
	if len(r.cfg.StandbyNames) == 0 {
		return nil
	}
	qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	row, err := r.q.StandbyAccess(qctx, r.cfg.Pool)
	if err != nil {
		return bad("StandbyNames", "{}: cannot read pg_stat_replication: %w", err)
	}
	if !row.CanRead {
		return bad("StandbyNames", "{}: the database role cannot see the standbys' positions in pg_stat_replication: "+
			"GRANT pg_monitor (or pg_read_all_stats) TO the relay's role")
	}
	r.log.Info("publishing waits for the standbys named", slog.Any("standby_names", r.cfg.StandbyNames),
		slog.Any("connected", row.Connected))
	return nil
}
