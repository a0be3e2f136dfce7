// Package relay runs pgrelay's relay as a library: it publishes the events
// committed to the outbox (pgrelay.Enqueue) to a broker, each key's events in
// commit order, and marks them published. Several relays may run against one
// database: they share the outbox partitions through leases, and a crashed
// relay's partitions are taken over once its leases expire. Prometheus
// metrics, health checks and the admin API are opt-in (Config.MetricsAddr,
// Config.AdminAddr).
//
// The broker is the Publisher given, so a program carries only the client of
// the broker it uses:
//
//	pub, err := nats.NewPublisher(ctx, nats.Config{URL: "nats://127.0.0.1:4222", CreateStream: true})
//	...
//	r, err := relay.New(relay.Config{Pool: pool, Publisher: pub})
//	...
//	err = r.Run(ctx)
package relay

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/pgrelay/pgrelay/internal/endpoints"
	"github.com/pgrelay/pgrelay/internal/metrics"
	"github.com/pgrelay/pgrelay/internal/pooler"
)

// Run checks the database (reachable and migrated), binds MetricsAddr and
// AdminAddr, then relays until ctx is cancelled and stops gracefully: the
// batches in flight are published and marked, the partition leases released
// so that other relays take them over at once. It returns nil after a
// graceful stop. Broker and database outages while running are retried.
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("relay: Run was already called; create another Relay")
	}
	if err := r.checkDatabase(ctx); err != nil {
		return err
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	checks := map[string]metrics.Check{"database": metrics.PingCheck(r.cfg.Pool)}
	if r.cfg.BrokerCheck != nil {
		checks["broker"] = r.cfg.BrokerCheck
	}
	ops, err := endpoints.Start(ctx, endpoints.Config{
		Flags:  endpoints.Flags{MetricsAddr: r.cfg.MetricsAddr, AdminAddr: r.cfg.AdminAddr, AdminToken: r.cfg.AdminToken},
		Struct: "relay.Config",
		Pool:   r.cfg.Pool, Registry: r.reg, Outbox: true, Logger: r.log, Checks: checks,
	})
	if err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	r.ops = ops
	close(r.started)
	runErr := r.run(ctx)
	stop() // Run returned on its own: stop the operator endpoints too
	return errors.Join(runErr, ops.Wait())
}

// checkDatabase fails start-up when the database cannot be reached or lacks
// the migrations.
func (r *Relay) checkDatabase(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.StartupTimeout)
	defer cancel()
	if err := pooler.CheckStart(ctx, r.cfg.Pool); err != nil {
		return bad("Pool", "{}: %w", err)
	}
	return nil
}

// MetricsAddr returns the address the metrics server listens on once Run has
// started it (useful with port 0), or nil.
func (r *Relay) MetricsAddr() net.Addr {
	select {
	case <-r.started:
		return r.ops.MetricsAddr()
	default:
		return nil
	}
}

// AdminAddr returns the address the admin API listens on once Run has started
// it, or nil.
func (r *Relay) AdminAddr() net.Addr {
	select {
	case <-r.started:
		return r.ops.AdminAddr()
	default:
		return nil
	}
}
