package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgrelay/pgrelay"
)

// runPipelineGroup measures the groups that run pgrelay itself.
func (b *bench) runPipelineGroup(ctx context.Context, group string) {
	n := b.cfg.Events
	switch group {
	case "relay":
		b.runRelayGroup(ctx)
	case "producer":
		b.runProducerGroup(ctx)
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
	case "inbox-ordered":
		b.runOrderedInboxGroup(ctx)
	case "scale":
		b.runScaleGroup(ctx)
	case "e2e":
		b.runE2EGroup(ctx)
	case "cost":
		b.runCostGroup(ctx)
	case "horizon":
		b.runHorizonGroup(ctx)
	}
}

func (b *bench) runScaleGroup(ctx context.Context) {
	n, prefill := b.cfg.Events, b.cfg.Prefill
	b.runRelayScale(ctx)

	// Inbox with prefill processed rows: one prefilled database, drained
	// Repeats times (each drain adds n processed rows to the table).
	b.attempt(ctx, "inbox drain, prefilled", []string{"scale_inbox_empty", "scale_inbox_prefilled"}, func(ctx context.Context) error {
		pool, err := b.inboxDB(ctx, prefill)
		if err != nil {
			return err
		}
		defer pool.Close()
		for range b.cfg.Repeats {
			// An empty-table drain right before each prefilled one (see
			// runRelayScale).
			empty, err := b.inboxDB(ctx, 0)
			if err != nil {
				return err
			}
			d, err := b.inboxDrain(ctx, empty, n, nil)
			empty.Close()
			if err != nil {
				return err
			}
			b.sample("scale_inbox_empty", rate(n, d))
			d, err = b.inboxDrain(ctx, pool, n, nil)
			if err != nil {
				return err
			}
			b.sample("scale_inbox_prefilled", rate(n, d))
		}
		return nil
	})
	b.note("scale_inbox_prefilled", fmt.Sprintf("%d processed rows (vacuumed) before the first drain", prefill))

	// Inbox during a retention cleanup: the processed rows are past the dedup
	// window, and pgrelay's inbox retention runs alongside the drain.
	var deletedNote string
	b.attempt(ctx, "inbox drain during retention", []string{"scale_inbox_retention"}, func(ctx context.Context) error {
		pool, err := b.inboxDB(ctx, prefill)
		if err != nil {
			return err
		}
		defer pool.Close()
		before, err := count(ctx, pool, "SELECT count(*) FROM pgrelay.inbox")
		if err != nil {
			return err
		}
		for range b.cfg.Repeats {
			d, err := b.inboxDrain(ctx, pool, n, func(ctx context.Context) error {
				return b.inboxRetention(ctx, pool)
			})
			if err != nil {
				return err
			}
			b.sample("scale_inbox_retention", rate(n, d))
		}
		after, err := count(ctx, pool, "SELECT count(*) FROM pgrelay.inbox")
		if err != nil {
			return err
		}
		deletedNote = fmt.Sprintf("; %d expired rows deleted over the drains", before+int64(b.cfg.Repeats*n)-after)
		return nil
	})
	b.note("scale_inbox_retention", "pgrelay.InboxCleaner (7-day window, 1,000 rows/batch, 10 ms pause) started every 100 ms on "+itoa(prefill)+" rows processed eight days ago"+deletedNote)
}

// inboxRetention runs pgrelay's inbox retention (a seven-day dedup window,
// default batches and pause), starting a run every 100 ms, until ctx ends.
func (b *bench) inboxRetention(ctx context.Context, pool *pgxpool.Pool) error {
	c, err := pgrelay.NewInboxCleaner(pool, pgrelay.InboxRetentionConfig{Interval: 100 * time.Millisecond}, b.log)
	if err != nil {
		return err
	}
	return c.Run(ctx)
}

// note sets a figure's note.
func (b *bench) note(id, text string) {
	if f := b.res.lookup(id); f != nil {
		f.Note = text
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
