package maintenance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/internal/db"
	"github.com/pgrelay/pgrelay/internal/wait"
)

// DefaultStatisticsInterval is Statistics.Interval's default. A table is
// stale once it changed by statisticsMinChanges rows and statisticsFraction
// of its rows; statisticsTimeout bounds a check and an ANALYZE.
const (
	DefaultStatisticsInterval = 5 * time.Second
	statisticsMinChanges      = 1000
	statisticsFraction        = 0.2
	statisticsTimeout         = time.Minute
)

// Statistics keeps the planner statistics of one of pgrelay's tables from
// going stale. Every row of the inbox and the outbox is written two or three
// times within seconds of its insert, and the batch statements' plans depend
// on the statistics: with none (a new table, or autovacuum off or behind),
// PostgreSQL's defaults made the inbox's bulk mark read every row of the
// handler per batch (37 ms a mark in the end to end benchmark, growing with
// the table). Autovacuum analyzes a table after 10 % of it changed, checking
// once a minute; this checks every Interval and analyzes a table that
// changed by at least 1,000 rows and 20 % of its rows since its last
// analyze, by anyone. With autovacuum keeping up it rarely fires. Services
// that share a table take turns (a transaction-scoped advisory lock): one
// analyzes, the others skip. ANALYZE reads a sample of the table (30,000
// rows at the default statistics target), under a lock that blocks no reads
// or writes.
type Statistics struct {
	// Pool is the database. Required.
	Pool *pgxpool.Pool
	// Table is "inbox" or "outbox". Required.
	Table string
	// Interval between checks (jittered ±20 %). 0: DefaultStatisticsInterval;
	// negative: Run does nothing.
	Interval time.Duration
	// Logger; nil: none.
	Logger *slog.Logger
}

// RunOnce analyzes the table if its statistics are stale and no other
// service is analyzing it, and reports whether it did.
func (s Statistics) RunOnce(ctx context.Context) (bool, error) {
	var analyze func(context.Context, db.DBTX) error
	q := db.New()
	switch s.Table {
	case "inbox":
		analyze = q.AnalyzeInbox
	case "outbox":
		analyze = q.AnalyzeOutbox
	default:
		return false, fmt.Errorf("statistics: unknown table %q", s.Table)
	}
	ctx, cancel := context.WithTimeout(ctx, statisticsTimeout)
	defer cancel()
	stale, err := q.TableStatisticsStale(ctx, s.Pool, db.TableStatisticsStaleParams{
		MinChanges: statisticsMinChanges, Fraction: statisticsFraction, TableName: s.Table,
	})
	if errors.Is(err, pgx.ErrNoRows) || err == nil && !stale {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("statistics of %s: %w", s.Table, err)
	}
	analyzed := false
	err = pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		locked, err := q.TryStatisticsLock(ctx, tx, s.Table)
		if err != nil || !locked {
			return err
		}
		analyzed = true
		return analyze(ctx, tx)
	})
	if err != nil {
		return false, fmt.Errorf("analyze %s: %w", s.Table, err)
	}
	return analyzed, nil
}

// Run calls RunOnce every Interval until ctx ends; a failure is logged and
// the check runs again at the next interval.
func (s Statistics) Run(ctx context.Context) {
	if s.Interval < 0 {
		return
	}
	if s.Interval == 0 {
		s.Interval = DefaultStatisticsInterval
	}
	if s.Logger == nil {
		s.Logger = slog.New(slog.DiscardHandler)
	}
	wait.Every(ctx, s.Interval, 0.2, func(ctx context.Context) {
		began := time.Now()
		analyzed, err := s.RunOnce(ctx)
		switch {
		case ctx.Err() != nil:
		case err != nil:
			s.Logger.Warn("keeping the table's planner statistics failed", slog.String("table", s.Table), slog.Any("error", err))
		case analyzed:
			s.Logger.Debug("table analyzed: its statistics were stale", slog.String("table", s.Table), slog.Duration("took", time.Since(began)))
		}
	})
}
