package inbox

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

// RetentionConfig configures the inbox's upkeep (Cleaner). A Worker runs a
// Cleaner with its Config.Retention unless Disabled; the zero value is the
// default upkeep.
//
// A processed row is what makes a redelivery of its event id a duplicate: it
// must be kept at least as long as the broker may still deliver that event
// again (JetStream: the stream's duplicate window for a republish by the
// relay, plus the consumer's redelivery horizon: AckWait × MaxDeliver, and
// any replay of the stream an operator may run). Window should exceed all of
// these with a margin; docs/architecture.md ("Inbox retention") explains the
// choice. Dead rows are never deleted: they stay until an operator requeues
// or purges them.
type RetentionConfig struct {
	// Disabled stops a Worker from running the upkeep, for processes that
	// leave it to another (one Cleaner per database is enough; more are
	// harmless). Default false: the worker runs it.
	Disabled bool
	// Pool is the database holding the inbox. Required for NewCleaner; a
	// Worker passes its own.
	Pool *pgxpool.Pool
	// Window is how long a processed row is kept after it was processed (the
	// dedup window); recorded key conflicts are kept as long. Default: 168h
	// (7 days). Minimum: MinDedupWindow (1h).
	Window time.Duration
	// ReleaseHorizon is how long Release records (inbox_releases) are kept:
	// a release only matters to a deferral racing with it, and batches stop
	// starting handlers at half a lease. Default: ten leases and at least
	// 10m (a Worker passes its Lease; NewCleaner assumes DefaultLease).
	ReleaseHorizon time.Duration
	// BatchSize is the most rows one DELETE removes; each batch is its own
	// short transaction. Default: 1000. Maximum: 100000.
	BatchSize int
	// DuplicatesMax is how many recorded duplicates (inbox_duplicates, the
	// console's feed) each run keeps: older ones are deleted in batches of
	// BatchSize. Receive counts older than a day (inbox_receive_counts) are
	// deleted the same way. Default: 10000. Minimum: 1.
	DuplicatesMax int
	// Interval is the mean time between runs (jittered ±20%); the first run
	// starts at once. Default: 1m.
	Interval time.Duration
	// Pause is the wait between two batches of one run, which leaves room to
	// the inbox's own writes. Default: 10ms.
	Pause time.Duration
	// QueryTimeout bounds each batch. Default: 30s.
	QueryTimeout time.Duration
	// Observer is told how many rows each run deleted. Default: none.
	Observer RetentionObserver
	// Logger receives a line per run that deleted rows, and failures.
	// Default: a no-op logger (a Worker passes its own).
	Logger *slog.Logger
}

// RetentionObserver is told what the inbox upkeep does, for metrics.
type RetentionObserver interface {
	// Deleted reports the processed rows deleted by one run.
	Deleted(n int64)
	// Failed reports a failed run.
	Failed(err error)
}

type nopRetentionObserver struct{}

func (nopRetentionObserver) Deleted(int64) {}
func (nopRetentionObserver) Failed(error)  {}

// Defaults for RetentionConfig.
const (
	DefaultDedupWindow        = 7 * 24 * time.Hour
	DefaultRetentionBatchSize = 1000
	DefaultDuplicatesMax      = 10000
	MaxRetentionBatchSize     = 100000
	DefaultRetentionInterval  = time.Minute
	DefaultRetentionPause     = 10 * time.Millisecond
	DefaultRetentionTimeout   = 30 * time.Second
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

// WithDefaults returns a copy of c with every unset field at its default.
func (c RetentionConfig) WithDefaults() RetentionConfig {
	setDefault(&c.Window, DefaultDedupWindow)
	setDefault(&c.ReleaseHorizon, releaseHorizon(DefaultLease))
	setDefault(&c.BatchSize, DefaultRetentionBatchSize)
	setDefault(&c.DuplicatesMax, DefaultDuplicatesMax)
	setDefault(&c.Interval, DefaultRetentionInterval)
	setDefault(&c.Pause, DefaultRetentionPause)
	setDefault(&c.QueryTimeout, DefaultRetentionTimeout)
	if c.Observer == nil {
		c.Observer = nopRetentionObserver{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// validate checks a RetentionConfig that WithDefaults has filled, all but its
// Pool (which a Worker fills from its own); errors name the field.
func (c RetentionConfig) validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, setting.Errorf("inbox", "Config", "Retention."+field, "{} "+format, args...))
	}
	if c.Window < MinDedupWindow {
		bad("Window", "must be at least %s, got %s", MinDedupWindow, c.Window)
	}
	if c.BatchSize < 1 || c.BatchSize > MaxRetentionBatchSize {
		bad("BatchSize", "must be between 1 and %d, got %d", MaxRetentionBatchSize, c.BatchSize)
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

// Cleaner is the inbox's upkeep: it periodically deletes processed rows past
// the dedup window, old Release records and key conflicts, and prunes the
// duplicate record and the receive counts, in small batches that never
// block the inbox's claims.
type Cleaner struct {
	cfg     RetentionConfig
	q       *db.Queries
	log     *slog.Logger
	batches maintenance.Batches
}

// NewCleaner checks cfg (after WithDefaults) and returns a Cleaner.
func NewCleaner(cfg RetentionConfig) (*Cleaner, error) {
	cfg = cfg.WithDefaults()
	err := cfg.validate()
	if cfg.Pool == nil {
		err = errors.Join(errors.New("inbox: Config.Retention.Pool is required"), err)
	}
	if err != nil {
		return nil, err
	}
	return &Cleaner{cfg: cfg, q: db.New(), log: cfg.Logger.With(slog.String("logger", "retention")),
		batches: maintenance.Batches{Size: cfg.BatchSize, Pause: cfg.Pause, Timeout: cfg.QueryTimeout}}, nil
}

// RunOnce deletes every expired processed row, batch by batch, and returns how
// many it deleted. Each batch is one DELETE by primary key over rows picked
// with FOR UPDATE SKIP LOCKED: it never waits on a row a worker holds, and
// touches no pending, processing or dead row. Then it deletes the Release
// records older than ReleaseHorizon and the recorded key conflicts older than
// the window the same way, the recorded duplicates beyond DuplicatesMax and
// the receive counts older than a day.
func (c *Cleaner) RunOnce(ctx context.Context) (int64, error) {
	pool := c.cfg.Pool
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
func (c *Cleaner) Run(ctx context.Context) error {
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
