package main

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/internal/retention"
)

// runPipelineGroup measures the groups that run pgrelay itself.
func (b *bench) runPipelineGroup(ctx context.Context, group string) {
	n := b.cfg.Events
	switch group {
	case "relay":
		b.runRelayGroup(ctx)
	case "inbox":
		for range b.cfg.Repeats {
			b.attempt(ctx, "inbox drain", []string{"inbox_drain"}, func(ctx context.Context) error {
				pool, err := b.inboxDB(ctx, 0)
				if err != nil {
					return err
				}
				defer pool.Close()
				d, err := b.inboxDrain(ctx, pool, n, nil)
				if err != nil {
					return err
				}
				b.sample("inbox_drain", rate(n, d))
				return nil
			})
		}
		b.note("inbox_drain", fmt.Sprintf("backlog of %d; %d workers × batch %d; ledger.Handler", n, b.cfg.Workers, b.cfg.BatchSize))
	case "scale":
		b.runScaleGroup(ctx)
	case "e2e":
		b.runE2EGroup(ctx)
	case "cost":
		b.runCostGroup(ctx)
	}
}

func (b *bench) runScaleGroup(ctx context.Context) {
	n, prefill := b.cfg.Events, b.cfg.Prefill
	b.runRelayScale(ctx)

	// Inbox with prefill processed rows: one prefilled database, drained
	// Repeats times (each drain adds n processed rows to the table).
	b.attempt(ctx, "inbox drain, prefilled", []string{"scale_inbox_prefilled"}, func(ctx context.Context) error {
		pool, err := b.inboxDB(ctx, prefill)
		if err != nil {
			return err
		}
		defer pool.Close()
		for range b.cfg.Repeats {
			d, err := b.inboxDrain(ctx, pool, n, nil)
			if err != nil {
				return err
			}
			b.sample("scale_inbox_prefilled", rate(n, d))
		}
		return nil
	})
	b.note("scale_inbox_prefilled", fmt.Sprintf("%d processed rows (vacuumed) before the first drain", prefill))

	// Inbox during a retention cleanup: the processed rows are past the dedup
	// window, and pgrelay's retention delete runs back to back alongside the
	// drain.
	var deleted atomic.Int64
	b.attempt(ctx, "inbox drain during retention", []string{"scale_inbox_retention"}, func(ctx context.Context) error {
		pool, err := b.inboxDB(ctx, prefill)
		if err != nil {
			return err
		}
		defer pool.Close()
		for range b.cfg.Repeats {
			d, err := b.inboxDrain(ctx, pool, n, func(ctx context.Context) error {
				return b.inboxRetention(ctx, pool, &deleted)
			})
			if err != nil {
				return err
			}
			b.sample("scale_inbox_retention", rate(n, d))
		}
		return nil
	})
	b.note("scale_inbox_retention", fmt.Sprintf("retention.Cleaner (7-day window, 1,000 rows/batch, 10 ms pause) every 100 ms; %d expired rows deleted during the drains", deleted.Load()))
}

// inboxRetention runs pgrelay's inbox retention (a seven-day dedup window,
// default batches and pause) every 100 ms until ctx ends, counting the rows
// it deleted.
func (b *bench) inboxRetention(ctx context.Context, pool *pgxpool.Pool, deleted *atomic.Int64) error {
	c, err := retention.New(retention.Config{
		Pool: pool, Interval: 100 * time.Millisecond, Observer: deleteCounter{deleted}, Logger: b.log,
	})
	if err != nil {
		return err
	}
	return c.Run(ctx)
}

type deleteCounter struct{ n *atomic.Int64 }

func (d deleteCounter) Deleted(n int64) { d.n.Add(n) }
func (d deleteCounter) Failed(error)    {}

// note sets a figure's note.
func (b *bench) note(id, text string) {
	if f := b.res.lookup(id); f != nil {
		f.Note = text
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
