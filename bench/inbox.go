package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/ledger"
)

// Fixture statements. Backlogs and finished rows are generated in the server
// with generate_series, which fills a million rows in seconds; they are
// fixtures of this measuring tool, not product queries, hence written here.
const (
	// seedInboxPending inserts $2 pending OrderPaid events with ids $1 || i.
	seedInboxPending = `INSERT INTO pgrelay.inbox (event_id, topic, key, event_type, payload)
SELECT $1::text || i, 'orders', 'order-' || (i % 1000), 'OrderPaid',
       convert_to(json_build_object('order_id', 'order-' || (i % 1000), 'amount_cents', 100 + i % 900,
                                    'currency', 'EUR')::text, 'UTF8')
FROM generate_series(0, $2::int - 1) AS i`
	// seedInboxProcessed inserts $1 processed rows finished eight days ago
	// (past the default seven-day dedup window, so retention may delete them).
	seedInboxProcessed = `INSERT INTO pgrelay.inbox (event_id, topic, key, event_type, payload, status, attempts,
                   lock_version, started_at, finished_at, received_at, occurred_at)
SELECT 'done-' || i, 'orders', 'order-' || (i % 1000), 'OrderPaid',
       convert_to(json_build_object('order_id', 'order-' || (i % 1000), 'amount_cents', 100 + i % 900,
                                    'currency', 'EUR')::text, 'UTF8'),
       'processed', 1, 1, t, t, t, t
FROM generate_series(0, $1::int - 1) AS i,
     LATERAL (SELECT now() - interval '8 days' + i * interval '1 ms') AS x(t)`
	// inboxRemaining says whether work is left; both parts are served by the
	// partial indexes on pending and processing rows and stop at the first
	// row (counting them every 5 ms took a core from the drain it measures).
	inboxRemaining = `SELECT (EXISTS (SELECT 1 FROM pgrelay.inbox WHERE status = 'pending')
     OR EXISTS (SELECT 1 FROM pgrelay.inbox WHERE status = 'processing'))::int`
	inboxDeadCount = `SELECT count(*) FROM pgrelay.inbox WHERE status = 'dead'`
	ledgerCount    = `SELECT count(*) FROM ledger_entries`
)

// inboxDb is a fresh database ready for inbox drains: orders seeded, and
// optionally prefill processed rows, vacuumed and analyzed.
func (b *bench) inboxDB(ctx context.Context, prefill int) (*pgxpool.Pool, error) {
	pool, _, err := b.dbs.fresh(ctx, b.cfg.Workers+4)
	if err != nil {
		return nil, err
	}
	if err := seedOrders(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	if prefill > 0 {
		if _, err := pool.Exec(ctx, seedInboxProcessed, prefill); err != nil {
			pool.Close()
			return nil, fmt.Errorf("prefill inbox: %w", err)
		}
	}
	if _, err := pool.Exec(ctx, "VACUUM (ANALYZE) pgrelay.inbox"); err != nil {
		pool.Close()
		return nil, fmt.Errorf("vacuum inbox: %w", err)
	}
	return pool, nil
}

// inboxDrain puts a backlog of n pending OrderPaid events in the inbox, then
// runs an in-process inbox worker with the ledger handler until every event is
// processed, and returns how long that took. during, when not nil, runs
// alongside the drain (for example a retention cleanup) and is cancelled when
// the drain ends.
func (b *bench) inboxDrain(ctx context.Context, pool *pgxpool.Pool, n int, during func(ctx context.Context) error) (time.Duration, error) {
	return b.inboxDrainWith(ctx, pool, n, during, seedInboxPending, false)
}

// inboxDrainWith is inboxDrain with the backlog seeded by seed (id prefix,
// count) and the worker in ordered mode when ordered is set.
func (b *bench) inboxDrainWith(ctx context.Context, pool *pgxpool.Pool, n int, during func(ctx context.Context) error,
	seed string, ordered bool) (time.Duration, error) {
	before, err := count(ctx, pool, ledgerCount)
	if err != nil {
		return 0, err
	}
	if _, err := pool.Exec(ctx, seed, "bench-"+randomHex(4)+"-", n); err != nil {
		return 0, fmt.Errorf("inbox backlog: %w", err)
	}
	if _, err := pool.Exec(ctx, "ANALYZE pgrelay.inbox"); err != nil {
		return 0, fmt.Errorf("analyze inbox: %w", err)
	}
	w, err := pgrelay.NewInboxWorker(pgrelay.InboxConfig{
		Pool: pool, Handler: ledger.Handler{}, Logger: b.log.With(slog.String("logger", "inbox")),
		Workers: b.cfg.Workers, BatchSize: b.cfg.BatchSize, Ordered: ordered,
	})
	if err != nil {
		return 0, err
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 2)
	start := time.Now()
	go func() { done <- w.Run(runCtx) }()
	if during != nil {
		go func() {
			if err := during(runCtx); err != nil && runCtx.Err() == nil {
				done <- fmt.Errorf("alongside the drain: %w", err)
			}
		}()
	}
	end, err := waitUntil(ctx, done, func(ctx context.Context) (bool, error) {
		left, err := count(ctx, pool, inboxRemaining)
		return left == 0, err
	})
	stop()
	if err != nil {
		return 0, err
	}
	elapsed := end.Sub(start)
	credited, err := count(ctx, pool, ledgerCount)
	if err != nil {
		return 0, err
	}
	if dead, _ := count(ctx, pool, inboxDeadCount); dead > 0 {
		return 0, fmt.Errorf("inbox drain: %d events went dead", dead)
	}
	if credited-before != int64(n) {
		return 0, fmt.Errorf("inbox drain: %d ledger credits for %d events", credited-before, n)
	}
	return elapsed, nil
}

// waitUntil polls cond every 5 ms until it holds, and returns when the first
// poll that saw it hold was sent. A value on failed ends the wait with that
// error (a background service that stopped).
func waitUntil(ctx context.Context, failed <-chan error, cond func(ctx context.Context) (bool, error)) (time.Time, error) {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		at := time.Now()
		ok, err := cond(ctx)
		if err != nil {
			return at, err
		}
		if ok {
			return at, nil
		}
		select {
		case <-ctx.Done():
			return at, fmt.Errorf("timed out waiting: %w", context.Cause(ctx))
		case err := <-failed:
			if err == nil {
				err = errors.New("stopped before the work was done")
			}
			return at, fmt.Errorf("service: %w", err)
		case <-t.C:
		}
	}
}

func count(ctx context.Context, pool *pgxpool.Pool, sql string) (int64, error) {
	var n int64
	if err := pool.QueryRow(ctx, sql).Scan(&n); err != nil {
		return 0, fmt.Errorf("count: %w", err)
	}
	return n, nil
}

// seedInboxKeyed inserts $2 pending OrderPaid events with ids $1 || i over
// 1000 keys, each key's events carrying contiguous per-key sequences
// 1, 2, 3, ... in id order, as the relay delivers them.
const seedInboxKeyed = `INSERT INTO pgrelay.inbox (event_id, topic, key, key_seq, event_type, payload)
SELECT $1::text || i, 'orders', 'order-' || (i % 1000), i / 1000 + 1, 'OrderPaid',
       convert_to(json_build_object('order_id', 'order-' || (i % 1000), 'amount_cents', 100 + i % 900,
                                    'currency', 'EUR')::text, 'UTF8')
FROM generate_series(0, $2::int - 1) AS i`

// runOrderedInboxGroup drains the same backlog of keyed, sequenced events
// with an unordered handler and with an ordered one (--ordered), each in a
// fresh database: the ratio is what ordered apply costs the drain.
func (b *bench) runOrderedInboxGroup(ctx context.Context) {
	n := b.cfg.Events
	for range b.cfg.Repeats {
		for _, ordered := range []bool{false, true} {
			id := "inbox_keyed_unordered"
			if ordered {
				id = "inbox_keyed_ordered"
			}
			b.attempt(ctx, id, []string{id}, func(ctx context.Context) error {
				pool, err := b.inboxDB(ctx, 0)
				if err != nil {
					return err
				}
				defer pool.Close()
				d, err := b.inboxDrainWith(ctx, pool, n, nil, seedInboxKeyed, ordered)
				if err != nil {
					return err
				}
				b.sample(id, rate(n, d))
				return nil
			})
		}
	}
	note := fmt.Sprintf("backlog of %d over 1000 keys (%d per key, in sequence); %d workers × batch %d; ledger.Handler",
		n, max(n/1000, 1), b.cfg.Workers, b.cfg.BatchSize)
	b.note("inbox_keyed_unordered", note)
	b.note("inbox_keyed_ordered", note+"; a key's events apply one batch after the other")
}
