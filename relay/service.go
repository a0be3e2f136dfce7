// Package relay runs pgrelay's relay as a library: it publishes the events
// committed to the outbox (pgrelay.Enqueue) to a broker, each key's events in
// commit order, and marks them published. Several relays may run against one
// database: they share the outbox partitions through leases, and a crashed
// relay's partitions are taken over once its leases expire. One relay may
// serve many databases (Config.Databases), each with its own partitions and
// leases, sharing the broker fairly (Config.InFlightEvents). Prometheus
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
	"log/slog"
	"net"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgrelay/pgrelay/internal/endpoints"
	"github.com/pgrelay/pgrelay/internal/metrics"
	"github.com/pgrelay/pgrelay/internal/pooler"
)

// Relay publishes the outboxes of its databases; create it with New and
// run it with Run.
type Relay struct {
	cfg Config // NodeID set; Pool normalised into Databases
	log *slog.Logger
	// field is the Config field the databases were given in: "Pool" or
	// "Databases".
	field string
	gate  *gate
	// reg holds the metrics MetricsAddr serves; ops runs the operator
	// endpoints once started is closed.
	reg     *prometheus.Registry
	running atomic.Bool
	started chan struct{}
	ops     *endpoints.Running

	// setMu serializes SetDatabases; mu guards dbs, the databases served,
	// and runCtx, Run's context.
	setMu  sync.Mutex
	mu     sync.Mutex
	dbs    []*dbRun
	runCtx context.Context
}

// New checks cfg and builds a relay; it connects to nothing until Run.
// Every invalid setting is reported, each naming its Config field.
func New(cfg Config) (*Relay, error) {
	err := cfg.Validate()
	if cfg.Pool == nil && len(cfg.Databases) == 0 {
		err = errors.Join(bad("Pool", "{} is required (or {Databases})"), err)
	}
	if cfg.Publisher == nil {
		err = errors.Join(bad("Publisher", "{} is required"), err)
	}
	if err != nil {
		return nil, err
	}
	field := "Databases"
	if cfg.Pool != nil {
		field = "Pool"
	}
	def := cfg.withDefaults()
	cfg.NodeID, cfg.log = def.NodeID, def.log // one name and one logger for every database
	cfg.Databases, cfg.Pool, cfg.ListenConnConfig = cfg.databases(), nil, nil
	r := &Relay{
		cfg:     cfg,
		field:   field,
		log:     def.log.With(slog.String("logger", "relay")).With(slog.String("node", def.NodeID)),
		gate:    newGate(def.InFlightEvents),
		reg:     metrics.NewRegistry(),
		started: make(chan struct{}),
	}
	for _, d := range cfg.Databases {
		run, err := r.newDB(d)
		if err != nil {
			return nil, err
		}
		r.dbs = append(r.dbs, run)
	}
	r.gate.serve(names(r.dbs))
	return r, nil
}

// NodeID returns the name this relay owns partitions under.
func (r *Relay) NodeID() string { return r.cfg.NodeID }

// Run checks every database (reachable and migrated at least to the
// relay's minimum version; the first failing one is named in the error; one
// behind the latest migration is served and logged as behind), binds MetricsAddr and AdminAddr, then relays
// until ctx is cancelled and stops gracefully: the batches in flight are
// published and marked, the partition leases released so that other relays
// take them over at once. It returns nil after a graceful stop. Broker and
// database outages while running are retried.
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("relay: Run was already called; create another Relay")
	}
	for _, d := range r.dbs {
		if err := r.checkDatabase(ctx, r.field, d); err != nil {
			return err
		}
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	checks := map[string]metrics.Check{"database": r.ping}
	if r.cfg.BrokerCheck != nil {
		checks["broker"] = r.cfg.BrokerCheck
	}
	ops, err := endpoints.Start(ctx, endpoints.Config{
		Flags:     endpoints.Flags{MetricsAddr: r.cfg.MetricsAddr, AdminAddr: r.cfg.AdminAddr, AdminToken: r.cfg.AdminToken},
		Struct:    "relay.Config",
		Databases: r.Databases, Lookup: r.pool, // as SetDatabases leaves them
		Registry: r.reg, Logger: r.log, Checks: checks,
	})
	if err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	r.ops = ops
	failed := make(chan error, len(r.dbs))
	r.mu.Lock()
	r.runCtx = ctx
	var runErr error
	for _, d := range r.dbs {
		if err := r.start(ctx, d, func(err error) { failed <- err }); err != nil {
			runErr = err
			break
		}
	}
	r.mu.Unlock()
	close(r.started)
	if runErr == nil {
		select {
		case <-ctx.Done():
		case runErr = <-failed: // at start: fail fast, as with one database
		}
	}
	stop()
	r.setMu.Lock() // no SetDatabases from here on
	r.mu.Lock()
	dbs := r.dbs
	r.mu.Unlock()
	var wg sync.WaitGroup
	for _, d := range dbs {
		if d.done != nil {
			wg.Go(func() { r.halt(d) })
		}
	}
	wg.Wait()
	r.setMu.Unlock()
	return errors.Join(runErr, ops.Wait())
}

// pool returns the pool of the database served under name.
func (r *Relay) pool(name string) (*pgxpool.Pool, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range r.dbs {
		if d.db.Name == name && !d.failed.Load() {
			return d.db.Pool, true
		}
	}
	return nil, false
}

// ping is /readyz's database check: every database served answers, or the
// error names those that do not.
func (r *Relay) ping(ctx context.Context) error {
	r.mu.Lock()
	dbs := r.dbs
	r.mu.Unlock()
	errs := make([]error, len(dbs))
	var wg sync.WaitGroup
	for i, d := range dbs {
		wg.Go(func() {
			if err := metrics.PingCheck(d.db.Pool)(ctx); err != nil {
				errs[i] = fmt.Errorf("database %s: %w", d.db.Name, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// checkDatabase fails when d cannot be reached or lacks a migration up to
// the relay's minimum (minSchema), and records d's schema version.
func (r *Relay) checkDatabase(ctx context.Context, field string, d *dbRun) error {
	ctx, cancel := context.WithTimeout(ctx, or(r.cfg.StartupTimeout, DefaultStartupTimeout))
	defer cancel()
	st, err := pooler.CheckSchema(ctx, d.db.Pool, r.minSchema())
	if err != nil {
		return bad(field, "{}: database %s: %w", d.db.Name, err)
	}
	d.schema = st
	return nil
}

// WALStatus returns the first database's replication slot status as of the
// last heartbeat, and false when the relay does not capture from the WAL
// (or has not looked yet).
func (r *Relay) WALStatus() (WALSlotStatus, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.dbs) == 0 {
		return WALSlotStatus{}, false
	}
	return r.dbs[0].e.WALStatus()
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
