package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The floors are the denominators: the same work as pgrelay, done with plain
// SQL through pgx on minimal tables, with the same batch sizes and the same
// number of connections. They use no pgrelay code and no pgrelay query, on
// purpose: a floor that went through pgrelay's query layer or schema (its
// triggers and extra indexes) would hide exactly the overhead the ratios are
// meant to show. The statements are therefore written here, not in queries/;
// this program is a measuring tool, not part of the product.

// floorSchema creates the floors' tables in a fresh database (next to the
// migrated schema, whose ledger tables the inbox floor credits).
const floorSchema = `
CREATE TABLE floor_outbox (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id     text        NOT NULL UNIQUE,
    topic        text        NOT NULL,
    key          text        NOT NULL,
    event_type   text        NOT NULL,
    payload      bytea       NOT NULL,
    headers      jsonb       NOT NULL DEFAULT '{}'::jsonb,
    occurred_at  timestamptz NOT NULL DEFAULT now(),
    created_at   timestamptz NOT NULL DEFAULT now(),
    status       text        NOT NULL DEFAULT 'pending',
    published_at timestamptz
);
CREATE INDEX floor_outbox_pending_idx ON floor_outbox (id) WHERE status = 'pending';
CREATE TABLE floor_inbox (
    event_id    text        PRIMARY KEY,
    topic       text        NOT NULL,
    key         text        NOT NULL,
    event_type  text        NOT NULL,
    payload     bytea       NOT NULL,
    headers     jsonb       NOT NULL DEFAULT '{}'::jsonb,
    occurred_at timestamptz NOT NULL DEFAULT now(),
    received_at timestamptz NOT NULL DEFAULT now(),
    status      text        NOT NULL DEFAULT 'pending',
    finished_at timestamptz
);
CREATE INDEX floor_inbox_pending_idx ON floor_inbox (received_at) WHERE status = 'pending';
`

const (
	floorOutboxInsertBatch = `INSERT INTO floor_outbox (event_id, topic, key, event_type, payload)
SELECT unnest($1::text[]), $2, unnest($3::text[]), $4, unnest($5::bytea[])`
	floorOutboxInsertOne = `INSERT INTO floor_outbox (event_id, topic, key, event_type, payload) VALUES ($1, $2, $3, $4, $5)`
	// The relay's minimal work per batch: read the oldest pending rows (what
	// it publishes) and mark them published, in one statement.
	floorOutboxMark = `UPDATE floor_outbox SET status = 'published', published_at = now()
WHERE id IN (SELECT id FROM floor_outbox WHERE status = 'pending' ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED)
RETURNING id, event_id, topic, key, event_type, payload, headers, occurred_at`
	floorInboxInsert = `INSERT INTO floor_inbox (event_id, topic, key, event_type, payload)
SELECT unnest($1::text[]), $2, unnest($3::text[]), $4, unnest($5::bytea[])
ON CONFLICT (event_id) DO NOTHING`
	floorInboxSelect = `SELECT event_id, payload FROM floor_inbox WHERE status = 'pending'
ORDER BY received_at LIMIT $1 FOR UPDATE SKIP LOCKED`
	floorLedgerInsert = `INSERT INTO ledger_entries (event_id, order_id, customer_id, amount_cents, currency)
SELECT unnest($1::text[]), unnest($2::text[]), unnest($3::text[]), unnest($4::bigint[]), 'EUR'`
	floorInboxDone = `UPDATE floor_inbox SET status = 'processed', finished_at = now() WHERE event_id = ANY($1::text[])`
)

// floorTimes are the phase durations of one floor run over n events.
type floorTimes struct {
	outboxInsertBatch, outboxMarkBatch time.Duration
	outboxInsertOne, outboxMarkOne     time.Duration
	inboxInsert, inboxProcess          time.Duration
	// cpuBatch and cpuOne are the CPU the phases of the combined floors
	// used: the batched outbox phases and the inbox phases, and the
	// 1-per-transaction outbox phases and the inbox phases.
	cpuBatch, cpuOne cpuUse
}

// runFloors measures every floor phase once, on a fresh database.
func (b *bench) runFloors(ctx context.Context) (floorTimes, error) {
	var ft floorTimes
	pool, _, err := b.dbs.fresh(ctx, b.cfg.Workers+1)
	if err != nil {
		return ft, err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, floorSchema); err != nil {
		return ft, fmt.Errorf("floor schema: %w", err)
	}
	if err := seedOrders(ctx, pool); err != nil {
		return ft, err
	}
	n, batch := b.cfg.Events, b.cfg.BatchSize
	gen := newGenerator("floor")
	cpu := b.cpuSources(b.dbs, nil)
	cpuStart := cpu.snapshot()

	// Outbox, batches: insert n rows, batch rows per transaction, then drain.
	ft.outboxInsertBatch, err = timed(func() error {
		return b.parallelBatches(ctx, n, batch, func(ctx context.Context, from, to int) error {
			evs := gen.batch(from, to)
			_, err := pool.Exec(ctx, floorOutboxInsertBatch, evs.ids, topic, evs.keys, eventType, evs.payloads)
			return err
		})
	})
	if err != nil {
		return ft, fmt.Errorf("floor outbox insert: %w", err)
	}
	if ft.outboxMarkBatch, err = b.floorOutboxDrain(ctx, pool, n); err != nil {
		return ft, err
	}

	// Outbox, one event per transaction.
	cpuOutboxBatch := cpu.snapshot()
	gen1 := newGenerator("floor1")
	ft.outboxInsertOne, err = timed(func() error {
		return b.parallelBatches(ctx, n, 1, func(ctx context.Context, from, _ int) error {
			e := gen1.event(from)
			_, err := pool.Exec(ctx, floorOutboxInsertOne, e.id, topic, e.key, eventType, e.payload)
			return err
		})
	})
	if err != nil {
		return ft, fmt.Errorf("floor outbox insert (1 per tx): %w", err)
	}
	if ft.outboxMarkOne, err = b.floorOutboxDrain(ctx, pool, n); err != nil {
		return ft, err
	}

	// Inbox: receive in batches, then process (select, credit, mark) in
	// batches, one transaction each.
	cpuOutboxOne := cpu.snapshot()
	ft.inboxInsert, err = timed(func() error {
		return b.parallelBatches(ctx, n, batch, func(ctx context.Context, from, to int) error {
			evs := gen.batch(from, to)
			_, err := pool.Exec(ctx, floorInboxInsert, evs.ids, topic, evs.keys, eventType, evs.payloads)
			return err
		})
	})
	if err != nil {
		return ft, fmt.Errorf("floor inbox insert: %w", err)
	}
	var done atomic.Int64
	ft.inboxProcess, err = timed(func() error {
		return b.parallel(ctx, func(ctx context.Context) error {
			for {
				k, err := floorInboxProcessBatch(ctx, pool, batch)
				if err != nil {
					return err
				}
				if k == 0 {
					return nil
				}
				done.Add(int64(k))
			}
		})
	})
	if err != nil {
		return ft, fmt.Errorf("floor inbox process: %w", err)
	}
	if int(done.Load()) != n {
		return ft, fmt.Errorf("floor inbox process: processed %d of %d events", done.Load(), n)
	}
	cpuEnd := cpu.snapshot()
	inbox := cpuEnd.since(cpuOutboxOne)
	ft.cpuBatch = cpuOutboxBatch.since(cpuStart).plus(inbox)
	ft.cpuOne = cpuEnd.since(cpuOutboxBatch)
	return ft, nil
}

func (b *bench) floorOutboxDrain(ctx context.Context, pool *pgxpool.Pool, n int) (time.Duration, error) {
	var marked atomic.Int64
	d, err := timed(func() error {
		return b.parallel(ctx, func(ctx context.Context) error {
			for {
				rows, err := pool.Query(ctx, floorOutboxMark, b.cfg.BatchSize)
				if err != nil {
					return err
				}
				k := 0
				for rows.Next() {
					k++
				}
				rows.Close()
				if err := rows.Err(); err != nil {
					return err
				}
				if k == 0 {
					return nil
				}
				marked.Add(int64(k))
			}
		})
	})
	if err != nil {
		return 0, fmt.Errorf("floor outbox mark: %w", err)
	}
	if int(marked.Load()) != n {
		return 0, fmt.Errorf("floor outbox mark: marked %d of %d rows", marked.Load(), n)
	}
	return d, nil
}

func floorInboxProcessBatch(ctx context.Context, pool *pgxpool.Pool, batch int) (int, error) {
	k := 0
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, floorInboxSelect, batch)
		if err != nil {
			return err
		}
		var ids, orders, customers []string
		var amounts []int64
		for rows.Next() {
			var id string
			var payload []byte
			if err := rows.Scan(&id, &payload); err != nil {
				rows.Close()
				return err
			}
			p, err := parsePaid(payload)
			if err != nil {
				rows.Close()
				return err
			}
			ids = append(ids, id)
			orders = append(orders, p.OrderID)
			customers = append(customers, p.CustomerID)
			amounts = append(amounts, p.AmountCents)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if len(ids) == 0 {
			return nil
		}
		if _, err := tx.Exec(ctx, floorLedgerInsert, ids, orders, customers, amounts); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, floorInboxDone, ids); err != nil {
			return err
		}
		k = len(ids)
		return nil
	})
	return k, err
}

// parallelBatches splits [0, n) into batches and runs fn on them from
// cfg.Workers goroutines.
func (b *bench) parallelBatches(ctx context.Context, n, batch int, fn func(ctx context.Context, from, to int) error) error {
	var next atomic.Int64
	return b.parallel(ctx, func(ctx context.Context) error {
		for {
			from := int(next.Add(int64(batch))) - batch
			if from >= n {
				return nil
			}
			if err := fn(ctx, from, min(from+batch, n)); err != nil {
				return err
			}
		}
	})
}

// parallel runs fn from cfg.Workers goroutines and waits for all of them. The
// first error cancels the others' context and is returned.
func (b *bench) parallel(ctx context.Context, fn func(ctx context.Context) error) error {
	return fanOut(ctx, b.cfg.Workers, func(ctx context.Context, _ int) error { return fn(ctx) })
}

// fanOut runs fn(ctx, i) for i in [0, n) concurrently and returns the first
// error, cancelling the others.
func fanOut(ctx context.Context, n int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(ctx, i); err != nil {
				once.Do(func() { first = err; cancel(err) })
			}
		}()
	}
	wg.Wait()
	return first
}

func timed(fn func() error) (time.Duration, error) {
	start := time.Now()
	err := fn()
	return time.Since(start), err
}
