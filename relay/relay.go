package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgrelay/pgrelay/internal/db"
	"github.com/pgrelay/pgrelay/internal/maintenance"
	"github.com/pgrelay/pgrelay/internal/metrics"
	"github.com/pgrelay/pgrelay/internal/notifier"
	"github.com/pgrelay/pgrelay/internal/wait"
)

// engine publishes the outbox of one database (Config.Pool); a Relay runs
// one per database.
type engine struct {
	cfg Config
	q   *db.Queries
	log *slog.Logger

	// notifier wakes the partition workers on outbox inserts and the
	// heartbeat when a peer released partitions.
	notifier *notifier.Notifier
	// cleaner deletes published rows past the retention.
	cleaner *outboxCleaner

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
	// recent counts the rows the workers read lately: they linger only
	// while the engine is busy (wakeup.go).
	recent rowMeter
	// marker sends the workers' marks, coalesced.
	marker *marker
	// floorReady is set while the database's schema has floorSchema (the
	// Relay's schema reads, noteSchema): the claims then start at their
	// partition's scan floor (floor.go).
	floorReady atomic.Bool
	// poolWarnedShare is the share last warned about as too large for the
	// pool (0: none); touched by Run's goroutine only.
	poolWarnedShare int

	// lockMu guards sess, the current lock session (nil: none now, or lease
	// only), and ended, the other relays' lock sessions seen ended by the
	// last check, with when each was first seen (session.go).
	lockMu sync.Mutex
	sess   *lockSession
	ended  map[endedOwner]time.Time

	// wal is the WAL capture (Config.Capture CaptureWAL), once Run started it.
	walMu sync.Mutex
	wal   *walSource
}

// PoolConns is how many connections a relay owning partitions uses at most
// at once: per partition the read of its next batch and the mark of the
// previous one, which run at the same time, plus the heartbeat, the
// retention delete, the statistics check and the poll of busy partitions.
// (The LISTEN and lock connections are dialled beside the pool.) A
// smaller pool makes partition workers queue for connections: with 16
// partitions on a 6-connection pool the relay drained 40–80 % slower.
func PoolConns(partitions int) int { return 2*partitions + 4 }

// newEngine checks cfg and builds the engine of cfg.Pool; it connects to
// nothing until run. Every invalid setting is reported, each naming its
// Config field. Its metrics are registered on cfg.registerer (none: a
// registry of its own).
func newEngine(cfg Config) (*engine, error) {
	err := cfg.Validate()
	if cfg.Pool == nil {
		err = errors.Join(bad("Pool", "{} is required"), err)
	}
	if cfg.Publisher == nil {
		err = errors.Join(bad("Publisher", "{} is required"), err)
	}
	if err != nil {
		return nil, err
	}
	reg := cfg.registerer
	if reg == nil {
		reg = metrics.NewRegistry()
	}
	if cfg.obs == nil {
		cfg.obs = metrics.NewRelayObserver(reg)
	}
	if cfg.walObs == nil {
		cfg.walObs = metrics.NewWALObserver(reg)
	}
	cfg = cfg.withDefaults()
	log := cfg.log.With(slog.String("logger", "relay")).With(slog.String("node", cfg.NodeID))
	if cfg.database != "" {
		log = log.With(slog.String("database", cfg.database))
	}
	r := &engine{
		cfg:     cfg,
		q:       db.New(),
		log:     log,
		workers: map[int32]*worker{},
		clock:   time.Now(),
		kick:    make(chan struct{}, 1),
		busy:    make(chan struct{}, 1),
	}
	r.marker = &marker{r: r}
	if cfg.NoListen || cfg.Capture == CaptureWAL {
		r.cleaner = newOutboxCleaner(cfg, r.log)
		return r, nil
	}
	n, err := notifier.New(notifier.Config{
		Pool: cfg.Pool, ConnConfig: cfg.ListenConnConfig,
		Topics: []notifier.Topic{
			{Channel: notifier.OutboxChannel, Notify: r.wakePartitions},
			{Channel: notifier.RelaysChannel, Notify: func(string) { r.kickHeartbeat() }},
		},
		OnListen:     r.listening, // notifications sent while not listening are lost
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
func (r *engine) NodeID() string { return r.cfg.NodeID }

// run relays until ctx is cancelled, then finishes the batches in flight,
// releases its leases and returns nil. Database and broker failures are
// retried with backoff; they never end run.
func (r *engine) run(ctx context.Context) error {
	if r.cfg.Capture == CaptureWAL {
		return r.runWAL(ctx)
	}
	if err := r.checkStandbys(ctx); err != nil {
		return err
	}
	r.log.Info("relay starting", slog.Int("batch_size", r.cfg.BatchSize), slog.Duration("lease", r.cfg.Lease))
	var bg sync.WaitGroup
	bg.Add(5)
	go func() { defer bg.Done(); r.pollBusy(ctx) }()
	go func() { defer bg.Done(); r.sweepIdle(ctx) }()
	go func() {
		defer bg.Done()
		if r.notifier != nil {
			r.notifier.Run(ctx)
		}
	}()
	go func() { defer bg.Done(); r.cleaner.Run(ctx) }()
	stats := maintenance.Statistics{Pool: r.cfg.Pool, Table: "outbox", Interval: r.cfg.StatisticsInterval, Logger: r.log}
	go func() { defer bg.Done(); stats.Run(ctx) }()
	// The lock session outlives the shutdown: the batches in flight are
	// published under it, and the leases released, before it ends.
	lockCtx, stopLock := context.WithCancel(context.WithoutCancel(ctx))
	defer stopLock()
	lockDone := make(chan struct{})
	go func() {
		defer close(lockDone)
		if r.locking() {
			r.keepLock(lockCtx)
		}
	}()

	retry := wait.New(r.backoffPolicy())
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			r.shutdown()
			stopLock()
			<-lockDone
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
			// A failed heartbeat is retried with backoff, not a whole
			// interval later: after a failover the first one often meets a
			// pooled connection to the old server, and the partitions wait
			// for the next success.
			d := min(retry.Next(), r.cfg.HeartbeatInterval)
			r.log.Warn("lease heartbeat failed", slog.Any("error", err), slog.Duration("retry_in", d))
			t.Reset(d)
			continue
		}
		retry.Reset()
		t.Reset(wait.Jitter(r.cfg.HeartbeatInterval, jitterSpread))
	}
}

// shutdown stops every worker, waits for the batches in flight, and releases
// the leases so that other relays take the partitions over at once.
func (r *engine) shutdown() {
	r.mu.Lock()
	for _, w := range r.workers {
		w.stop(false)
	}
	r.mu.Unlock()
	r.wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.QueryTimeout)
	defer cancel()
	// One transaction, so that a peer woken by the notification already
	// counts one relay fewer when it computes its share. Every lease still
	// naming this relay is released, not only those of its last workers: a
	// worker whose lock session ended left its lease to the next session,
	// which will not come.
	err := pgx.BeginFunc(ctx, r.cfg.Pool, func(tx pgx.Tx) error {
		total, err := r.q.CountPartitions(ctx, tx)
		if err != nil {
			return fmt.Errorf("count partitions: %w", err)
		}
		all := make([]int32, total)
		for i := range all {
			all[i] = int32(i)
		}
		if _, err := r.q.ReleasePartitions(ctx, tx, db.ReleasePartitionsParams{Owner: r.cfg.NodeID, Partitions: all}); err != nil {
			return fmt.Errorf("release leases: %w", err)
		}
		if err := r.q.DeleteNode(ctx, tx, r.cfg.NodeID); err != nil {
			return fmt.Errorf("unregister: %w", err)
		}
		return r.q.NotifyRelays(ctx, tx, "left "+r.cfg.NodeID)
	})
	if err != nil {
		r.log.Warn("release leases and unregister; other relays take the partitions over when the leases expire", slog.Any("error", err))
	}
}

// backoffPolicy is the relay's backoff: from BackoffMin, doubling up to
// BackoffMax, ±10%.
func (r *engine) backoffPolicy() wait.Policy {
	return wait.Policy{Min: r.cfg.BackoffMin, Max: r.cfg.BackoffMax, Spread: jitterSpread}
}

// jitterSpread is the relay's jitter on its polls, heartbeats and backoffs:
// ±10%.
const jitterSpread = 0.1
