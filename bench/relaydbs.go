package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/relay"
)

// relayDrainDatabases drains k databases at once with one in-process relay:
// the relay starts on an idle database, each of the k others gets a backlog
// of n events committed in one statement, then SetDatabases hands them all to
// the relay; it returns the time from that call until no row of any is
// pending (each database's start, its checks and its 16 partitions taken, is
// in it). Each database's pool has conns connections.
func (b *bench) relayDrainDatabases(ctx context.Context, k, n, conns int) (time.Duration, error) {
	target, err := relayTargets()[b.cfg.Broker](ctx, b)
	if err != nil {
		return 0, err
	}
	defer target.drop()
	// The seeding and polling pools, and the relay's pools (one per
	// database, as relay run opens them).
	var seeds []*pgxpool.Pool
	var dbs []relay.Database
	defer func() {
		for _, p := range seeds {
			p.Close()
		}
		for _, d := range dbs {
			d.Pool.Close()
		}
	}()
	for i := range k + 1 {
		seed, err := b.outboxDB(ctx, 0)
		if err != nil {
			return 0, err
		}
		seeds = append(seeds, seed)
		rpool, err := openPool(ctx, seed.Config().ConnString(), conns)
		if err != nil {
			return 0, err
		}
		dbs = append(dbs, relay.Database{Name: fmt.Sprintf("db%d", i), Pool: rpool})
	}
	pub, err := target.newPublisher(ctx)
	if err != nil {
		return 0, err
	}
	defer pub.Close()
	r, err := relay.New(relay.Config{
		Databases: dbs[:1], Publisher: pub, Logger: b.log.With(slog.String("logger", "relay")), BatchSize: b.cfg.BatchSize,
		NodeID: "bench-relay-databases", Lease: 3 * time.Second, HeartbeatInterval: 250 * time.Millisecond,
	})
	if err != nil {
		return 0, err
	}
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	failed := make(chan error, 1)
	defer func() { stop(); wg.Wait() }()
	wg.Go(func() {
		if err := r.Run(runCtx); err != nil {
			failed <- err
		}
	})
	if _, err := waitUntil(ctx, failed, func(ctx context.Context) (bool, error) {
		return len(r.Databases()) == 1, nil
	}); err != nil {
		return 0, fmt.Errorf("relay start: %w", err)
	}
	for _, p := range seeds[1:] {
		if _, err := p.Exec(ctx, seedOutboxPending, "bench-"+randomHex(4)+"-", n); err != nil {
			return 0, fmt.Errorf("outbox backlog: %w", err)
		}
	}
	start := time.Now()
	if err := r.SetDatabases(ctx, dbs); err != nil {
		return 0, err
	}
	// Polled every 5 ms: only the databases still pending (a drained one
	// gets no more rows), one at a time.
	pending := seeds[1:]
	end, err := waitUntil(ctx, failed, func(ctx context.Context) (bool, error) {
		for len(pending) > 0 {
			left, err := count(ctx, pending[0], outboxPending)
			if err != nil || left > 0 {
				return false, err
			}
			pending = pending[1:]
		}
		return true, nil
	})
	if err != nil {
		return 0, err
	}
	for _, p := range seeds[1:] {
		if dead, _ := count(ctx, p, outboxDead); dead > 0 {
			return 0, fmt.Errorf("relay drain, %d databases: %d events went dead", k, dead)
		}
	}
	got, err := target.stored(ctx)
	if err != nil {
		return 0, err
	}
	if got != uint64(k*n) {
		return 0, fmt.Errorf("relay drain, %d databases: the %s destination holds %d messages for %d events", k, b.cfg.Broker, got, k*n)
	}
	return end.Sub(start), nil
}
