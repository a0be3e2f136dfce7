package main

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/relay"
)

const (
	// seedOutboxPending writes a backlog of $2 OrderPaid events, ids $1 || i,
	// in one statement (through the outbox's insert trigger, like any
	// producer).
	seedOutboxPending = `INSERT INTO pgrelay.outbox (event_id, topic, key, event_type, payload)
SELECT $1::text || i, 'orders', 'order-' || (i % 1000), 'OrderPaid',
       convert_to(json_build_object('order_id', 'order-' || (i % 1000), 'amount_cents', 100 + i % 900,
                                    'currency', 'EUR')::text, 'UTF8')
FROM generate_series(0, $2::int - 1) AS i`
	// seedOutboxPublished writes $1 rows published two days ago. The insert
	// trigger (which forces new rows to pending) is bypassed for this fixture
	// only; ids still come from the outbox's sequence, partitions from
	// outbox_partition as the trigger sets them.
	seedOutboxPublished = `INSERT INTO pgrelay.outbox (id, event_id, topic, key, partition, event_type, payload, status, attempts, published_at, created_at, occurred_at)
SELECT nextval('pgrelay.outbox_id_seq'), 'done-' || i, 'orders', 'order-' || (i % 1000), pgrelay.outbox_partition('order-' || (i % 1000)), 'OrderPaid',
       convert_to(json_build_object('order_id', 'order-' || (i % 1000), 'amount_cents', 100 + i % 900,
                                    'currency', 'EUR')::text, 'UTF8'),
       'published', 1, t, t, t
FROM generate_series(0, $1::int - 1) AS i,
     LATERAL (SELECT now() - interval '2 days' + i * interval '1 ms') AS x(t)`
	// outboxPending is 1 while any row is pending. EXISTS, not count(*): a
	// count of a large backlog every few milliseconds takes a backend's worth
	// of CPU from the drain being measured.
	outboxPending = `SELECT (EXISTS (SELECT 1 FROM pgrelay.outbox WHERE status = 'pending'))::int`
	outboxDead    = `SELECT count(*) FROM pgrelay.outbox WHERE status = 'dead'`
	// relayOwners counts the partitions each live relay holds.
	relayOwners = `SELECT coalesce(array_agg(n ORDER BY n), '{}') FROM (
    SELECT count(*)::int AS n FROM pgrelay.relay_partitions WHERE owner IS NOT NULL AND lease_until > now() GROUP BY owner) s`
	relayPartitions = `SELECT count(*)::int FROM pgrelay.relay_partitions`
)

// relayOptions shape one relay drain.
type relayOptions struct {
	instances int
	// retention, when set, makes the relays delete published rows older than
	// a day, checking every 100 ms, while they drain.
	retention bool
	// batchSize is the relays' batch size; 0 takes the bench's batch size.
	batchSize int
}

// outboxDB is a fresh database for relay drains, optionally holding prefill
// published rows (vacuumed and analyzed).
func (b *bench) outboxDB(ctx context.Context, prefill int) (*pgxpool.Pool, error) {
	pool, _, err := b.dbs.fresh(ctx, 4)
	if err != nil {
		return nil, err
	}
	if prefill > 0 {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "ALTER TABLE pgrelay.outbox DISABLE TRIGGER USER"); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, seedOutboxPublished, prefill); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "ALTER TABLE pgrelay.outbox ENABLE TRIGGER USER")
			return err
		})
		if err != nil {
			pool.Close()
			return nil, fmt.Errorf("prefill outbox: %w", err)
		}
	}
	if _, err := pool.Exec(ctx, "VACUUM (ANALYZE) pgrelay.outbox"); err != nil {
		pool.Close()
		return nil, fmt.Errorf("vacuum outbox: %w", err)
	}
	return pool, nil
}

// relayDrain starts opts.instances in-process relays (each with its own pool
// and NATS connection, publishing to a fresh stream), waits until they have
// shared the partitions, then commits a backlog of n events in one
// transaction and returns the time from that commit until no row is pending.
func (b *bench) relayDrain(ctx context.Context, pool *pgxpool.Pool, n int, opts relayOptions) (time.Duration, error) {
	target, err := relayTargets()[b.cfg.Broker](ctx, b)
	if err != nil {
		return 0, err
	}
	defer target.drop()
	url := pool.Config().ConnString()

	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	failed := make(chan error, opts.instances)
	defer func() { stop(); wg.Wait() }()
	var total int
	if err := pool.QueryRow(ctx, relayPartitions).Scan(&total); err != nil {
		return 0, err
	}
	// Each relay's pool holds what its share of the partitions uses at once
	// (a read and a mark per partition): a smaller pool makes the partition
	// workers queue for connections.
	conns := relay.PoolConns((total + opts.instances - 1) / opts.instances)
	for i := range opts.instances {
		rpool, err := openPool(ctx, url, conns)
		if err != nil {
			return 0, err
		}
		pub, err := target.newPublisher(ctx)
		if err != nil {
			rpool.Close()
			return 0, err
		}
		cfg := relay.Config{
			Pool: rpool, Publisher: pub, Logger: b.log.With(slog.String("logger", "relay")), BatchSize: cmp.Or(opts.batchSize, b.cfg.BatchSize),
			NodeID: fmt.Sprintf("bench-relay-%d", i),
			// Short leases so that several relays share the partitions within
			// a second or two of starting.
			Lease: 3 * time.Second, HeartbeatInterval: 250 * time.Millisecond,
		}
		if opts.retention {
			cfg.Retention, cfg.RetentionInterval = 24*time.Hour, 100*time.Millisecond
		}
		r, err := relay.New(cfg)
		if err != nil {
			pub.Close()
			rpool.Close()
			return 0, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer rpool.Close()
			defer pub.Close()
			if err := r.Run(runCtx); err != nil {
				failed <- err
			}
		}()
	}

	// Wait for the relays to share every partition fairly.
	if _, err := waitUntil(ctx, failed, func(ctx context.Context) (bool, error) {
		var owned []int32
		if err := pool.QueryRow(ctx, relayOwners).Scan(&owned); err != nil {
			return false, err
		}
		sum := 0
		for _, k := range owned {
			sum += int(k)
			if int(k) > (total+opts.instances-1)/opts.instances {
				return false, nil
			}
		}
		return len(owned) == opts.instances && sum == total, nil
	}); err != nil {
		return 0, fmt.Errorf("relays sharing partitions: %w", err)
	}

	if _, err := pool.Exec(ctx, seedOutboxPending, "bench-"+randomHex(4)+"-", n); err != nil {
		return 0, fmt.Errorf("outbox backlog: %w", err)
	}
	committed := time.Now()
	end, err := waitUntil(ctx, failed, func(ctx context.Context) (bool, error) {
		left, err := count(ctx, pool, outboxPending)
		return left == 0, err
	})
	if err != nil {
		return 0, err
	}
	if dead, _ := count(ctx, pool, outboxDead); dead > 0 {
		return 0, fmt.Errorf("relay drain: %d events went dead", dead)
	}
	got, err := target.stored(ctx)
	if err != nil {
		return 0, err
	}
	if got != uint64(n) {
		return 0, fmt.Errorf("relay drain: the %s destination holds %d messages for %d events", b.cfg.Broker, got, n)
	}
	return end.Sub(committed), nil
}

// relayDatabaseConns is the pool of each database of the many-databases
// drain: relay.PoolConns(16) shared out, at least 4, so that k databases stay
// within a server's default 100 connections beside the rest of the bench.
func relayDatabaseConns(k int) int { return max(4, relay.PoolConns(16)/k) }

func openPool(ctx context.Context, url string, maxConns int) (*pgxpool.Pool, error) {
	return openTracedPool(ctx, url, maxConns, nil)
}

// openTracedPool is openPool whose statements t counts (none when nil).
func openTracedPool(ctx context.Context, url string, maxConns int, t *sqlTrace) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = int32(maxConns)
	if t != nil {
		t.attach(cfg)
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

func (b *bench) runRelayGroup(ctx context.Context) {
	n := b.cfg.Events
	var loads []string // the load average after each many-databases drain
	for range b.cfg.Repeats {
		b.attempt(ctx, "relay floor", []string{"floor_relay_mark", "floor_broker", "floor_relay"}, func(ctx context.Context) error {
			mark, pub, err := b.relayFloors(ctx, n, b.cfg.BatchSize)
			if err != nil {
				return err
			}
			b.sample("floor_relay_mark", rate(n, mark))
			b.sample("floor_broker", rate(n, pub))
			b.sample("floor_relay", rate(n, mark+pub))
			return nil
		})
		b.attempt(ctx, "relay drain", []string{"relay_drain"}, func(ctx context.Context) error {
			pool, err := b.outboxDB(ctx, 0)
			if err != nil {
				return err
			}
			defer pool.Close()
			d, err := b.relayDrain(ctx, pool, n, relayOptions{instances: 1})
			if err != nil {
				return err
			}
			b.sample("relay_drain", rate(n, d))
			return nil
		})
		b.attempt(ctx, "relay drain, many databases", []string{"relay_drain_databases"}, func(ctx context.Context) error {
			k := b.cfg.RelayDatabases
			d, err := b.relayDrainDatabases(ctx, k, n, relayDatabaseConns(k))
			if err != nil {
				return err
			}
			b.sample("relay_drain_databases", rate(k*n, d))
			loads = append(loads, loadAvg())
			fmt.Printf("relay drain, %d databases of %d events at once: %.0f/s  [load %s]\n", k, n, rate(k*n, d), loads[len(loads)-1])
			return nil
		})
		b.attempt(ctx, "relay drain, default batch", []string{"relay_drain_default"}, func(ctx context.Context) error {
			pool, err := b.outboxDB(ctx, 0)
			if err != nil {
				return err
			}
			defer pool.Close()
			d, err := b.relayDrain(ctx, pool, n, relayOptions{instances: 1, batchSize: relay.DefaultBatchSize})
			if err != nil {
				return err
			}
			b.sample("relay_drain_default", rate(n, d))
			return nil
		})
	}
	k := b.cfg.RelayDatabases
	b.note("relay_drain_databases", fmt.Sprintf("%d databases of %d events each, committed before SetDatabases hands them to 1 relay (batch %d; a pool of %d connections each: the server's connections are shared); time from that call, each database's start included, to none pending in any; message count checked; load average after each: %s",
		k, n, b.cfg.BatchSize, relayDatabaseConns(k), strings.Join(loads, " | ")))
	b.note("relay_drain", fmt.Sprintf("backlog of %d committed in one tx; 1 relay, batch %d, pool of relay.PoolConns(16) connections; time from commit to none pending; message count at the %s destination checked", n, b.cfg.BatchSize, b.cfg.Broker))
}

func (b *bench) runRelayScale(ctx context.Context) {
	n, prefill := b.cfg.Events, b.cfg.Prefill
	b.attempt(ctx, "relay drain, prefilled", []string{"scale_relay_empty", "scale_relay_prefilled"}, func(ctx context.Context) error {
		pool, err := b.outboxDB(ctx, prefill)
		if err != nil {
			return err
		}
		defer pool.Close()
		for range b.cfg.Repeats {
			// An empty-table drain right before each prefilled one: the
			// machine's load drifts, so the pair shares the same moment.
			empty, err := b.outboxDB(ctx, 0)
			if err != nil {
				return err
			}
			d, err := b.relayDrain(ctx, empty, n, relayOptions{instances: 1})
			empty.Close()
			if err != nil {
				return err
			}
			b.sample("scale_relay_empty", rate(n, d))
			d, err = b.relayDrain(ctx, pool, n, relayOptions{instances: 1})
			if err != nil {
				return err
			}
			b.sample("scale_relay_prefilled", rate(n, d))
		}
		return nil
	})
	b.note("scale_relay_prefilled", fmt.Sprintf("%d published rows (vacuumed) before the first drain", prefill))

	var deletedNote string
	b.attempt(ctx, "relay drain during retention", []string{"scale_relay_retention"}, func(ctx context.Context) error {
		pool, err := b.outboxDB(ctx, prefill)
		if err != nil {
			return err
		}
		defer pool.Close()
		var before, after int64
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM pgrelay.outbox").Scan(&before); err != nil {
			return err
		}
		for range b.cfg.Repeats {
			d, err := b.relayDrain(ctx, pool, n, relayOptions{instances: 1, retention: true})
			if err != nil {
				return err
			}
			b.sample("scale_relay_retention", rate(n, d))
		}
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM pgrelay.outbox").Scan(&after); err != nil {
			return err
		}
		deletedNote = fmt.Sprintf("; %d rows deleted over the drains", before+int64(b.cfg.Repeats*n)-after)
		return nil
	})
	b.note("scale_relay_retention", "the relay's own retention (Retention 24h, checked every 100ms) on "+itoa(prefill)+" rows published two days ago"+deletedNote)

	for _, k := range b.cfg.RelayInstances {
		id := "scale_relays_" + itoa(k)
		for range b.cfg.Repeats {
			b.attempt(ctx, fmt.Sprintf("relay drain, %d relays", k), []string{id}, func(ctx context.Context) error {
				pool, err := b.outboxDB(ctx, 0)
				if err != nil {
					return err
				}
				defer pool.Close()
				d, err := b.relayDrain(ctx, pool, n, relayOptions{instances: k})
				if err != nil {
					return err
				}
				b.sample(id, rate(n, d))
				return nil
			})
		}
		b.note(id, fmt.Sprintf("%d in-process relays, each with its own pool and NATS connection, partitions shared before the backlog commits", k))
	}
}
