package pgrelay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/internal/db"
	"github.com/pgrelay/pgrelay/internal/maintenance"
	"github.com/pgrelay/pgrelay/internal/setting"
	"github.com/pgrelay/pgrelay/internal/wait"
)

type nopRetentionObserver struct{}

func (nopRetentionObserver) Deleted(int64) {}
func (nopRetentionObserver) Failed(error)  {}

// Defaults for InboxRetentionConfig.
const (
	DefaultDedupWindow        = 7 * 24 * time.Hour
	defaultRetentionBatchSize = 1000
	DefaultDuplicatesMax      = 10000
	maxRetentionBatchSize     = 100000
	defaultRetentionInterval  = time.Minute
	defaultRetentionPause     = 10 * time.Millisecond
	defaultRetentionTimeout   = 30 * time.Second
	minReleaseHorizon         = 10 * time.Minute
	// MinDedupWindow is the shortest dedup window accepted: an hour, 30
	// times JetStream's default duplicate window (2 minutes), so that the
	// inbox always absorbs what the broker's own dedup lets through after its
	// window (a relay republishing after a crash or a takeover), JetStream's
	// redeliveries (AckWait, 30 s by default) and a stream duplicate window an
	// operator raised to minutes. The consumer also checks the window against
	// the stream's real MaxAge and duplicate window at attach.
	MinDedupWindow = time.Hour
)

// releaseHorizon is how long Release records are kept for a lease: many
// leases, and at least ten minutes.
func releaseHorizon(lease time.Duration) time.Duration {
	return max(10*lease, minReleaseHorizon)
}

// withDefaults returns a copy of c with every unset field at its default.
func (c InboxRetentionConfig) withDefaults() InboxRetentionConfig {
	setDefault(&c.Window, DefaultDedupWindow)
	setDefault(&c.ReleaseHorizon, releaseHorizon(DefaultLease))
	setDefault(&c.BatchSize, defaultRetentionBatchSize)
	setDefault(&c.DuplicatesMax, DefaultDuplicatesMax)
	setDefault(&c.Interval, defaultRetentionInterval)
	setDefault(&c.Pause, defaultRetentionPause)
	setDefault(&c.QueryTimeout, defaultRetentionTimeout)
	if c.Observer == nil {
		c.Observer = nopRetentionObserver{}
	}
	return c
}

// validate checks a InboxRetentionConfig that withDefaults has filled, all but its
// Pool (which a InboxWorker fills from its own); errors name the field.
func (c InboxRetentionConfig) validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, setting.Errorf("inbox", "InboxConfig", "Retention."+field, "{} "+format, args...))
	}
	if c.Window < MinDedupWindow {
		bad("Window", "must be at least %s, got %s", MinDedupWindow, c.Window)
	}
	if c.BatchSize < 1 || c.BatchSize > maxRetentionBatchSize {
		bad("BatchSize", "must be between 1 and %d, got %d", maxRetentionBatchSize, c.BatchSize)
	}
	if c.DuplicatesMax < 1 {
		bad("DuplicatesMax", "must be at least 1, got %d", c.DuplicatesMax)
	}
	for _, d := range []struct {
		name string
		d    time.Duration
	}{{"ReleaseHorizon", c.ReleaseHorizon}, {"Interval", c.Interval}, {"Pause", c.Pause}, {"QueryTimeout", c.QueryTimeout}} {
		if d.d < 0 {
			bad(d.name, "must be positive, got %s", d.d)
		}
	}
	return errors.Join(errs...)
}

// InboxCleaner is the inbox's upkeep: it periodically deletes processed rows past
// the dedup window, old Release records and key conflicts, and prunes the
// duplicate record and the receive counts, in small batches that never
// block the inbox's claims.
type InboxCleaner struct {
	cfg     InboxRetentionConfig
	pool    *pgxpool.Pool
	q       *db.Queries
	log     *slog.Logger
	batches maintenance.Batches
}

// NewInboxCleaner returns the inbox's upkeep on pool with cfg (Disabled is
// ignored), logging to logger (nil: nowhere), for a process that runs it
// apart from the inbox workers (their InboxConfig.Retention.Disabled). It
// fails if cfg is invalid, naming the field.
func NewInboxCleaner(pool *pgxpool.Pool, cfg InboxRetentionConfig, logger *slog.Logger) (*InboxCleaner, error) {
	return newCleaner(pool, cfg, loggerOr(logger))
}

func newCleaner(pool *pgxpool.Pool, cfg InboxRetentionConfig, log *slog.Logger) (*InboxCleaner, error) {
	cfg = cfg.withDefaults()
	err := cfg.validate()
	if pool == nil {
		err = errors.Join(errors.New("pgrelay: NewInboxCleaner: the pool is required"), err)
	}
	if err != nil {
		return nil, err
	}
	return &InboxCleaner{cfg: cfg, pool: pool, q: db.New(), log: log.With(slog.String("logger", "retention")),
		batches: maintenance.Batches{Size: cfg.BatchSize, Pause: cfg.Pause, Timeout: cfg.QueryTimeout}}, nil
}

// RunOnce deletes every expired processed row, batch by batch, and returns how
// many it deleted. Each batch is one DELETE by primary key over rows picked
// with FOR UPDATE SKIP LOCKED: it never waits on a row a worker holds, and
// touches no pending, processing or dead row. Then it deletes the Release
// records older than ReleaseHorizon and the recorded key conflicts older than
// the window the same way, the recorded duplicates beyond DuplicatesMax and
// the receive counts older than a day.
func (c *InboxCleaner) RunOnce(ctx context.Context) (int64, error) {
	pool := c.pool
	total, err := c.batches.Delete(ctx, func(ctx context.Context, size int32) (int64, error) {
		return c.q.DeleteExpiredInboxBatch(ctx, pool, db.DeleteExpiredInboxBatchParams{
			WindowSeconds: c.cfg.Window.Seconds(), BatchSize: size,
		})
	})
	if err != nil {
		return total, fmt.Errorf("inbox retention: delete expired inbox rows: %w", err)
	}
	releases, err := c.batches.Delete(ctx, func(ctx context.Context, size int32) (int64, error) {
		return c.q.PruneInboxReleases(ctx, pool, db.PruneInboxReleasesParams{
			OlderThan: interval(c.cfg.ReleaseHorizon), BatchSize: size,
		})
	})
	if err != nil {
		return total, fmt.Errorf("inbox retention: delete old release records: %w", err)
	}
	if releases > 0 {
		c.log.Debug("old release records deleted", slog.Int64("rows", releases))
	}
	conflicts, err := c.batches.Delete(ctx, func(ctx context.Context, size int32) (int64, error) {
		return c.q.DeleteExpiredInboxConflicts(ctx, pool, db.DeleteExpiredInboxConflictsParams{
			WindowSeconds: c.cfg.Window.Seconds(), BatchSize: size,
		})
	})
	if err != nil {
		return total, fmt.Errorf("inbox retention: delete expired key conflicts: %w", err)
	}
	if conflicts > 0 {
		c.log.Debug("expired key conflicts deleted", slog.Int64("rows", conflicts))
	}
	dups, err := c.batches.Delete(ctx, func(ctx context.Context, size int32) (int64, error) {
		return c.q.ConsolePruneDuplicates(ctx, pool, db.ConsolePruneDuplicatesParams{
			Keep: int64(c.cfg.DuplicatesMax), BatchSize: size,
		})
	})
	if err != nil {
		return total, fmt.Errorf("inbox retention: prune the duplicate record: %w", err)
	}
	counts, err := c.batches.Delete(ctx, func(ctx context.Context, size int32) (int64, error) {
		return c.q.ConsolePruneReceiveCounts(ctx, pool, size)
	})
	if err != nil {
		return total, fmt.Errorf("inbox retention: prune the receive counts: %w", err)
	}
	if dups > 0 || counts > 0 {
		c.log.Debug("duplicate record pruned", slog.Int64("duplicates", dups), slog.Int64("minute_counts", counts))
	}
	return total, nil
}

// Run calls RunOnce at once and then every Interval (jittered ±20%) until
// ctx is cancelled, and then returns nil. Failures are logged and retried at
// the next interval.
func (c *InboxCleaner) Run(ctx context.Context) error {
	wait.Every(ctx, c.cfg.Interval, 0.2, func(ctx context.Context) {
		n, err := c.RunOnce(ctx)
		switch {
		case ctx.Err() != nil:
		case err != nil:
			c.cfg.Observer.Failed(err)
			c.log.Warn("inbox retention failed", slog.Any("error", err))
		default:
			c.cfg.Observer.Deleted(n)
			if n > 0 {
				c.log.Info("expired inbox rows deleted", slog.Int64("rows", n), slog.Duration("window", c.cfg.Window))
			}
		}
	})
	return nil
}
