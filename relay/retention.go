package relay

import (
	"context"
	"log/slog"

	"github.com/pgrelay/pgrelay/internal/db"
	"github.com/pgrelay/pgrelay/internal/maintenance"
	"github.com/pgrelay/pgrelay/internal/wait"
)

// outboxCleaner is the outbox's upkeep, run by the relay beside its
// partition workers: it deletes published rows older than Config.Retention,
// every Config.RetentionInterval (jittered ±10%, the first run at start-up),
// in batches of Config.RetentionBatchSize picked with FOR UPDATE SKIP LOCKED
// through the published rows' index, so that deletion never waits on, or
// stalls, publishing. Dead rows are kept.
type outboxCleaner struct {
	cfg     Config
	q       *db.Queries
	log     *slog.Logger
	batches maintenance.Batches
}

func newOutboxCleaner(cfg Config, log *slog.Logger) *outboxCleaner {
	return &outboxCleaner{cfg: cfg, q: db.New(), log: log.With(slog.String("logger", "retention")),
		batches: maintenance.Batches{Size: cfg.RetentionBatchSize, Timeout: cfg.QueryTimeout}}
}

// runOnce deletes every published row past the retention, batch by batch,
// and returns how many it deleted.
func (c *outboxCleaner) runOnce(ctx context.Context) (int64, error) {
	return c.batches.Delete(ctx, func(ctx context.Context, size int32) (int64, error) {
		return c.q.DeletePublished(ctx, c.cfg.Pool, db.DeletePublishedParams{
			RetentionSeconds: c.cfg.Retention.Seconds(), BatchSize: size,
		})
	})
}

// Run calls runOnce at once and then every RetentionInterval until ctx ends;
// a failure is logged and retried at the next interval. It does nothing when
// Config.Retention is negative.
func (c *outboxCleaner) Run(ctx context.Context) {
	if c.cfg.Retention < 0 {
		return
	}
	wait.Every(ctx, c.cfg.RetentionInterval, jitterSpread, func(ctx context.Context) {
		n, err := c.runOnce(ctx)
		switch {
		case ctx.Err() != nil:
		case err != nil:
			c.log.Warn("retention delete failed", slog.Any("error", err))
		case n > 0:
			c.log.Debug("deleted published rows past retention", slog.Int64("rows", n))
		}
	})
}
