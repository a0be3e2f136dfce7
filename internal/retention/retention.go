// Package retention deletes processed inbox rows once their dedup window has
// passed, in small batches that never block the inbox's claims.
//
// A processed row is what makes a redelivery of its event id a duplicate: it
// must be kept at least as long as the broker may still deliver that event
// again (JetStream: the stream's duplicate window for a republish by the
// relay, plus the consumer's redelivery horizon: AckWait × MaxDeliver, and
// any replay of the stream an operator may run). Window should exceed all of
// these with a margin; docs/architecture.md ("Operations") explains the
// choice. Dead rows are never deleted here: they stay until an operator
// requeues or purges them. Outbox retention is the relay's own (published
// rows, relay.Config).
package retention

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/pgrelay/pgrelay/internal/backoff"
	"github.com/pgrelay/pgrelay/internal/db"
)

// Config configures a Cleaner.
type Config struct {
	// Pool is the database holding the inbox. Required.
	Pool *pgxpool.Pool
	// Window is how long a processed row is kept after it was processed (the
	// dedup window). Default: 168h (7 days). Minimum: MinWindow (1h).
	Window time.Duration
	// BatchSize is the most rows one DELETE removes; each batch is its own
	// short transaction. Default: 1000. Maximum: 100000.
	BatchSize int
	// DuplicatesMax is how many recorded duplicates (inbox_duplicates, the
	// console's feed) each run keeps: older ones are deleted in batches of
	// BatchSize. Receive counts older than a day (inbox_receive_counts) are
	// deleted the same way. Default: 10000. Minimum: 1.
	DuplicatesMax int
	// Interval is the mean time between runs (jittered ±20%). Default: 1m.
	Interval time.Duration
	// Pause is the wait between two batches of one run, which leaves room to
	// the inbox's own writes. Default: 10ms.
	Pause time.Duration
	// QueryTimeout bounds each batch. Default: 30s.
	QueryTimeout time.Duration
	// Observer is told how many rows each run deleted. Default: none.
	Observer Observer
	// Logger receives a line per run that deleted rows, and failures.
	// Default: a no-op logger.
	Logger *zap.Logger
}

// Observer is told what retention does, for metrics.
type Observer interface {
	// Deleted reports rows deleted by one run.
	Deleted(n int64)
	// Failed reports a failed run.
	Failed(err error)
}

type nopObserver struct{}

func (nopObserver) Deleted(int64) {}
func (nopObserver) Failed(error)  {}

// Defaults for Config.
const (
	DefaultWindow        = 7 * 24 * time.Hour
	DefaultBatchSize     = 1000
	DefaultDuplicatesMax = 10000
	MaxBatchSize         = 100000
	DefaultInterval      = time.Minute
	DefaultPause         = 10 * time.Millisecond
	DefaultQueryTimeout  = 30 * time.Second
	// MinWindow is the shortest dedup window accepted: an hour, 30 times
	// JetStream's default duplicate window (2 minutes), so that the inbox
	// always absorbs what the broker's own dedup lets through after its
	// window (a relay republishing after a crash or a takeover), JetStream's
	// redeliveries (AckWait, 30 s by default) and a stream duplicate window an
	// operator raised to minutes. The consumer also checks the window against
	// the stream's real MaxAge and duplicate window at attach.
	MinWindow = time.Hour
)

// WithDefaults returns a copy of c with every unset field at its default.
func (c Config) WithDefaults() Config {
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.DuplicatesMax == 0 {
		c.DuplicatesMax = DefaultDuplicatesMax
	}
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.Pause == 0 {
		c.Pause = DefaultPause
	}
	if c.QueryTimeout == 0 {
		c.QueryTimeout = DefaultQueryTimeout
	}
	if c.Observer == nil {
		c.Observer = nopObserver{}
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	return c
}

func (c Config) validate() error {
	var errs []error
	if c.Pool == nil {
		errs = append(errs, errors.New("retention: Config.Pool is required"))
	}
	if c.Window < MinWindow {
		errs = append(errs, fmt.Errorf("retention: Config.Window (--dedup-window / DEDUP_WINDOW) must be at least %s, got %s", MinWindow, c.Window))
	}
	if c.BatchSize < 1 || c.BatchSize > MaxBatchSize {
		errs = append(errs, fmt.Errorf("retention: Config.BatchSize must be between 1 and %d, got %d", MaxBatchSize, c.BatchSize))
	}
	if c.DuplicatesMax < 1 {
		errs = append(errs, fmt.Errorf("retention: Config.DuplicatesMax (--dedup-record-max / DEDUP_RECORD_MAX) must be at least 1, got %d", c.DuplicatesMax))
	}
	for name, d := range map[string]time.Duration{"Interval": c.Interval, "Pause": c.Pause, "QueryTimeout": c.QueryTimeout} {
		if d < 0 {
			errs = append(errs, fmt.Errorf("retention: Config.%s must be positive, got %s", name, d))
		}
	}
	return errors.Join(errs...)
}

// Cleaner periodically deletes processed inbox rows older than the dedup
// window.
type Cleaner struct {
	cfg Config
	q   *db.Queries
	log *zap.Logger
}

// New checks cfg and returns a Cleaner.
func New(cfg Config) (*Cleaner, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Cleaner{cfg: cfg, q: db.New(), log: cfg.Logger.Named("retention")}, nil
}

// RunOnce deletes every expired processed row, batch by batch, and returns how
// many it deleted. Each batch is one DELETE by primary key over rows picked
// with FOR UPDATE SKIP LOCKED: it never waits on a row a worker holds, and
// touches no pending, processing or dead row. Then it deletes the dependency
// release records (inbox_releases) and the recorded key conflicts
// (inbox_conflicts) older than the window the same way, the recorded
// duplicates beyond DuplicatesMax and the receive counts older than a day.
func (c *Cleaner) RunOnce(ctx context.Context) (int64, error) {
	total, err := c.batches(ctx, func(ctx context.Context) (int64, error) {
		return c.q.AdminDeleteExpiredInboxBatch(ctx, c.cfg.Pool, db.AdminDeleteExpiredInboxBatchParams{
			WindowSeconds: c.cfg.Window.Seconds(), BatchSize: int32(c.cfg.BatchSize),
		})
	})
	if err != nil {
		return total, fmt.Errorf("retention: delete expired inbox rows: %w", err)
	}
	releases, err := c.batches(ctx, func(ctx context.Context) (int64, error) {
		return c.q.AdminDeleteExpiredInboxReleases(ctx, c.cfg.Pool, db.AdminDeleteExpiredInboxReleasesParams{
			WindowSeconds: c.cfg.Window.Seconds(), BatchSize: int32(c.cfg.BatchSize),
		})
	})
	if err != nil {
		return total, fmt.Errorf("retention: delete expired inbox releases: %w", err)
	}
	if releases > 0 {
		c.log.Debug("expired inbox releases deleted", zap.Int64("rows", releases))
	}
	conflicts, err := c.batches(ctx, func(ctx context.Context) (int64, error) {
		return c.q.AdminDeleteExpiredInboxConflicts(ctx, c.cfg.Pool, db.AdminDeleteExpiredInboxConflictsParams{
			WindowSeconds: c.cfg.Window.Seconds(), BatchSize: int32(c.cfg.BatchSize),
		})
	})
	if err != nil {
		return total, fmt.Errorf("retention: delete expired key conflicts: %w", err)
	}
	if conflicts > 0 {
		c.log.Debug("expired key conflicts deleted", zap.Int64("rows", conflicts))
	}
	dups, err := c.batches(ctx, func(ctx context.Context) (int64, error) {
		return c.q.ConsolePruneDuplicates(ctx, c.cfg.Pool, db.ConsolePruneDuplicatesParams{
			Keep: int64(c.cfg.DuplicatesMax), BatchSize: int32(c.cfg.BatchSize),
		})
	})
	if err != nil {
		return total, fmt.Errorf("retention: prune the duplicate record: %w", err)
	}
	counts, err := c.batches(ctx, func(ctx context.Context) (int64, error) {
		return c.q.ConsolePruneReceiveCounts(ctx, c.cfg.Pool, int32(c.cfg.BatchSize))
	})
	if err != nil {
		return total, fmt.Errorf("retention: prune the receive counts: %w", err)
	}
	if dups > 0 || counts > 0 {
		c.log.Debug("duplicate record pruned", zap.Int64("duplicates", dups), zap.Int64("minute_counts", counts))
	}
	return total, nil
}

// batches runs one batch after another, each with its own timeout, until a
// batch deletes fewer than BatchSize rows, and returns the total.
func (c *Cleaner) batches(ctx context.Context, batch func(context.Context) (int64, error)) (int64, error) {
	var total int64
	for {
		qctx, cancel := context.WithTimeout(ctx, c.cfg.QueryTimeout)
		n, err := batch(qctx)
		cancel()
		if err != nil {
			return total, err
		}
		total += n
		if n < int64(c.cfg.BatchSize) {
			return total, nil
		}
		select {
		case <-ctx.Done():
			return total, ctx.Err()
		case <-time.After(c.cfg.Pause):
		}
	}
}

// Run calls RunOnce every Interval (jittered) until ctx is cancelled, and then
// returns nil. Failures are logged and retried at the next interval.
func (c *Cleaner) Run(ctx context.Context) error {
	for {
		n, err := c.RunOnce(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			c.cfg.Observer.Failed(err)
			c.log.Warn("inbox retention failed", zap.Error(err))
		default:
			c.cfg.Observer.Deleted(n)
			if n > 0 {
				c.log.Info("expired inbox rows deleted", zap.Int64("rows", n), zap.Duration("window", c.cfg.Window))
			}
		}
		d := backoff.Jitter(c.cfg.Interval, 0.2)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}
