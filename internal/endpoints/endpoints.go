// Package endpoints starts a service's operator endpoints: the metrics and
// health server, the admin API and the database gauges,
// from the settings both services take on their command line.
package endpoints

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgrelay/pgrelay/internal/admin"
	"github.com/pgrelay/pgrelay/internal/admin/adminhttp"
	"github.com/pgrelay/pgrelay/internal/console"
	"github.com/pgrelay/pgrelay/internal/metrics"
	"github.com/pgrelay/pgrelay/internal/setting"
)

// Flags are the operator settings both services take on their command
// line.
type Flags struct {
	// MetricsAddr serves /metrics, /livez (/healthz) and /readyz; empty disables.
	MetricsAddr string
	// AdminAddr serves the admin API; empty disables.
	AdminAddr string
	// AdminToken is the admin API's bearer token.
	AdminToken string
	// DedupWindow is how long processed inbox rows are kept (consumer only;
	// the consumer's inbox worker runs the retention, inbox.RetentionConfig).
	DedupWindow time.Duration
	// DedupRecordMax is how many recorded duplicates retention keeps
	// (consumer only).
	DedupRecordMax int
}

// Config configures Start.
type Config struct {
	// Flags are the operator settings.
	Flags Flags
	// Pool is the service's database. Required unless Databases is set.
	Pool *pgxpool.Pool
	// Databases, when set, lists the databases the admin API and the
	// console serve now, in order (the first is the default), and Lookup
	// finds one's pool by name; both are asked on every request, so the set
	// may change. Default: Pool alone, named after its database.
	Databases func() []string
	// Lookup finds a database's pool by name; set with Databases.
	Lookup func(name string) (*pgxpool.Pool, bool)
	// Registry is the service's registry; the DB gauges are registered on
	// it. Required.
	Registry *prometheus.Registry
	// Checks are the readiness checks of /readyz. Default: none.
	Checks map[string]metrics.Check
	// Inbox registers the inbox gauges (consumer).
	Inbox bool
	// Outbox registers the outbox gauges (relay).
	Outbox bool
	// Counters feeds the admin API's dedup hit rate. Default: nil.
	Counters func() (received, duplicates float64, ok bool)
	// Broker reads the broker's retention settings for the web console's
	// relay page. Default: nil, not shown.
	Broker func(ctx context.Context) (*console.BrokerSettings, error)
	// Logger receives the servers' logs. Default: a no-op logger.
	Logger *slog.Logger
	// Struct, when set, is the configuration struct whose fields MetricsAddr
	// and AdminAddr the errors name (as *setting.FieldErrors, "consumer.Config").
	// Default: the command-line flags.
	Struct string
}

// addrError reports an address that cannot be bound, naming its setting.
func (c Config) addrError(field, addr string, err error) error {
	if c.Struct != "" {
		return setting.Errorf("", c.Struct, field, "{} %q: %w", addr, err)
	}
	flag := map[string]string{"MetricsAddr": "--metrics-addr (METRICS_ADDR)", "AdminAddr": "--admin-addr (ADMIN_ADDR)"}[field]
	return fmt.Errorf("%s %q: %w", flag, addr, err)
}

// databases are the admin operations' databases: Pool alone, or those
// Databases lists, each a Service over its pool as Lookup finds it now.
func (c Config) databases() (admin.Databases, error) {
	acfg := admin.Config{Pool: c.Pool, Logger: c.Logger, Counters: c.Counters}
	if c.Databases == nil {
		svc, err := admin.New(acfg)
		return admin.One(c.Pool.Config().ConnConfig.Database, svc), err
	}
	return admin.Databases{Names: c.Databases, Service: func(name string) (*admin.Service, bool) {
		pool, ok := c.Lookup(name)
		if !ok {
			return nil, false
		}
		one := acfg
		one.Pool, one.Database = pool, name
		svc, err := admin.New(one)
		return svc, err == nil
	}}, nil
}

// Running is a service's operator endpoints: the metrics and health server and
// the admin API. Table upkeep is the services' own (the inbox worker's
// inbox.Cleaner, the relay's outbox cleaner).
type Running struct {
	wg          sync.WaitGroup
	mu          sync.Mutex
	errs        []error
	metricsAddr net.Addr
	adminAddr   net.Addr
}

// Start checks cfg, binds the listeners (so a bad or busy address fails
// here, naming its flag) and starts serving until ctx is cancelled. Wait
// returns once everything stopped.
func Start(ctx context.Context, cfg Config) (*Running, error) {
	if (cfg.Pool == nil && cfg.Databases == nil) || cfg.Registry == nil || (cfg.Databases == nil) != (cfg.Lookup == nil) {
		return nil, errors.New("endpoints: Config.Pool (or Databases and Lookup) and Config.Registry are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	o := &Running{}
	type runner func(context.Context) error
	var runners []runner

	if cfg.Inbox {
		coll, err := metrics.NewInboxCollector(metrics.DBCollectorConfig{Pool: cfg.Pool, Logger: cfg.Logger})
		if err != nil {
			return nil, err
		}
		cfg.Registry.MustRegister(coll)
	}
	if cfg.Outbox {
		coll, err := metrics.NewOutboxCollector(metrics.DBCollectorConfig{Pool: cfg.Pool, Logger: cfg.Logger})
		if err != nil {
			return nil, err
		}
		cfg.Registry.MustRegister(coll)
	}

	var listeners []net.Listener
	closeAll := func() {
		for _, ln := range listeners {
			_ = ln.Close()
		}
	}
	if cfg.Flags.MetricsAddr != "" {
		srv, err := metrics.NewServer(metrics.ServerConfig{Addr: cfg.Flags.MetricsAddr, Registry: cfg.Registry,
			Checks: cfg.Checks, Logger: cfg.Logger})
		if err != nil {
			return nil, err
		}
		ln, err := net.Listen("tcp", cfg.Flags.MetricsAddr)
		if err != nil {
			return nil, cfg.addrError("MetricsAddr", cfg.Flags.MetricsAddr, err)
		}
		listeners = append(listeners, ln)
		o.metricsAddr = ln.Addr()
		runners = append(runners, func(ctx context.Context) error { return srv.Serve(ctx, ln) })
	}
	if cfg.Flags.AdminAddr != "" {
		dbs, err := cfg.databases()
		if err != nil {
			closeAll()
			return nil, err
		}
		program := "relay"
		if cfg.Inbox {
			program = "consumer"
		}
		con, err := console.New(console.Config{Databases: dbs, Program: program, Token: cfg.Flags.AdminToken,
			Gatherer: cfg.Registry, DedupWindow: cfg.Flags.DedupWindow, Broker: cfg.Broker, Logger: cfg.Logger})
		if err != nil {
			closeAll()
			return nil, err
		}
		srv, err := adminhttp.NewServer(adminhttp.ServerConfig{Databases: dbs, Addr: cfg.Flags.AdminAddr, Token: cfg.Flags.AdminToken,
			Logger: cfg.Logger, Console: con.Handler()})
		if err != nil {
			closeAll()
			return nil, err
		}
		ln, err := net.Listen("tcp", cfg.Flags.AdminAddr)
		if err != nil {
			closeAll()
			return nil, cfg.addrError("AdminAddr", cfg.Flags.AdminAddr, err)
		}
		listeners = append(listeners, ln)
		o.adminAddr = ln.Addr()
		runners = append(runners, func(ctx context.Context) error { return srv.Serve(ctx, ln) }, con.Run)
	}
	for _, run := range runners {
		o.wg.Go(func() {
			if err := run(ctx); err != nil && ctx.Err() == nil {
				cfg.Logger.Error("operator endpoint stopped", slog.Any("error", err))
				o.mu.Lock()
				o.errs = append(o.errs, err)
				o.mu.Unlock()
			}
		})
	}
	return o, nil
}

// MetricsAddr returns the metrics server's bound address, or nil.
func (o *Running) MetricsAddr() net.Addr { return o.metricsAddr }

// AdminAddr returns the admin API's bound address, or nil.
func (o *Running) AdminAddr() net.Addr { return o.adminAddr }

// Wait blocks until everything Start started has stopped (after its
// context was cancelled) and returns the errors of those that failed.
func (o *Running) Wait() error {
	o.wg.Wait()
	o.mu.Lock()
	defer o.mu.Unlock()
	return errors.Join(o.errs...)
}
