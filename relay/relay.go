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
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/internal/admin/adminhttp"
	"github.com/pgrelay/pgrelay/internal/endpoints"
	"github.com/pgrelay/pgrelay/internal/logbridge"
	"github.com/pgrelay/pgrelay/internal/metrics"
	"github.com/pgrelay/pgrelay/internal/pooler"
	engine "github.com/pgrelay/pgrelay/internal/relay"
	"github.com/pgrelay/pgrelay/internal/setting"
	"github.com/pgrelay/pgrelay/migrations"
)

// Defaults for Config.
const (
	DefaultBatchSize          = engine.DefaultBatchSize
	DefaultLease              = engine.DefaultLease
	DefaultPollInterval       = engine.DefaultPollInterval
	DefaultPublishTimeout     = engine.DefaultPublishTimeout
	DefaultQueryTimeout       = engine.DefaultQueryTimeout
	DefaultBackoffMin         = engine.DefaultBackoffMin
	DefaultBackoffMax         = engine.DefaultBackoffMax
	DefaultRetention          = engine.DefaultRetention
	DefaultRetentionInterval  = engine.DefaultRetentionInterval
	DefaultRetentionBatchSize = engine.DefaultRetentionBatchSize
	DefaultStartupTimeout     = 30 * time.Second
)

// PoolConns is the pool size a relay needs to serve partitions outbox
// partitions at full speed (16 in a default install): its partition workers
// read and mark at once. A smaller pool makes them queue for connections.
func PoolConns(partitions int) int { return engine.PoolConns(partitions) }

// Config configures a Relay. The zero value of every optional field means
// the default it documents. Errors name the fields as relay.Config.<Field>.
type Config struct {
	// Pool is the PostgreSQL database holding the outbox (migrated). Required.
	// Give it PoolConns(partitions) connections; the relay dials two more,
	// for LISTEN and for its lock session (unless NoListen).
	Pool *pgxpool.Pool
	// Publisher publishes the events, for example nats.NewPublisher's,
	// kafka.NewPublisher's or rabbitmq.NewPublisher's. Required. The relay
	// does not close it.
	Publisher broker.Publisher
	// BrokerCheck, when set, is /readyz's check of the broker (for example
	// that the publisher is connected). Default: none.
	BrokerCheck func(context.Context) error
	// NodeID names this relay among the partitions' owners; unique among
	// running relays. Default: "<hostname>-<pid>-<random>".
	NodeID string
	// BatchSize is the most rows read, published and marked at once per
	// partition. Default DefaultBatchSize (500); at most 10,000.
	BatchSize int
	// Lease is how long a partition lease lasts without renewal; a crashed
	// relay's partitions are taken over about a second after its lock
	// session ended (docs/relay.md, "Crash takeover"), or after the lease
	// where that cannot be told (NoListen). Default DefaultLease (15s); at
	// least 100ms.
	Lease time.Duration
	// HeartbeatInterval is how often leases are renewed and partitions
	// rebalanced; at most half of Lease. Default: Lease/3.
	HeartbeatInterval time.Duration
	// PollInterval is how often an idle partition looks for rows when no
	// notification arrives (LISTEN/NOTIFY is the fast path). Default
	// DefaultPollInterval (1s).
	PollInterval time.Duration
	// ListenConnConfig, when set, is the connection LISTEN and the lock
	// session are dialled with instead of Pool's settings: a direct
	// connection to PostgreSQL when Pool goes through a connection pooler in
	// transaction mode (docs/pooler.md). Default: Pool's.
	ListenConnConfig *pgx.ConnConfig
	// NoListen turns LISTEN/NOTIFY wake-ups and the lock session off: idle
	// partitions look for rows every PollInterval, partitions another relay
	// released are taken at the next heartbeat, and a crashed relay's when
	// their leases expire. For a Pool behind a pooler in transaction mode,
	// where LISTEN and session locks do not work, without ListenConnConfig.
	NoListen bool
	// PublishTimeout bounds publishing one batch and awaiting its
	// acknowledgements. Default DefaultPublishTimeout (30s).
	PublishTimeout time.Duration
	// QueryTimeout bounds each database statement. Default 10s.
	QueryTimeout time.Duration
	// BackoffMin is the first pause of a partition after a transient
	// failure; it doubles up to BackoffMax, with jitter. Defaults 100ms and
	// 30s.
	BackoffMin, BackoffMax time.Duration
	// Retention is how long published rows are kept before deletion; dead
	// rows are never deleted; negative disables deletion. Default
	// DefaultRetention (24h).
	Retention time.Duration
	// RetentionInterval is how often published rows past Retention are
	// deleted. Default 1m.
	RetentionInterval time.Duration
	// RetentionBatchSize is how many rows one delete statement removes.
	// Default 1,000.
	RetentionBatchSize int
	// StatisticsInterval is how often Run checks whether the outbox's
	// planner statistics went stale and analyzes it then. Default 5s;
	// negative: never.
	StatisticsInterval time.Duration
	// AsyncMarks lets each batch's mark commit without waiting for its WAL
	// flush (synchronous_commit off for the mark's own transaction only): a
	// mark a server crash loses leaves its rows pending, and they are
	// published again and deduplicated (by the broker's dedup id, then the
	// inbox), exactly as after a relay crash between publish and mark.
	// Default false: on a slow-flushing disk it made other commits wait.
	AsyncMarks bool
	// StandbyNames, when set, holds each batch until every standby named
	// (its application_name in pg_stat_replication) has flushed the WAL
	// past the batch's commits: a failover to one of them then never leaves
	// an event published for a commit the promoted server lacks. No such
	// standby connected: nothing is published. The role needs pg_monitor or
	// pg_read_all_stats. Table capture only (docs/operations.md, "Failover").
	StandbyNames []string

	// Capture is where events are read from: "table" (the default), the
	// outbox table, or "wal", the events producers write with pgrelay.Emit
	// (or the SQL function pgrelay.emit), read from a logical replication
	// slot; the server needs wal_level = logical (docs/wal.md).
	Capture string
	// WALSlot names the replication slot of Capture "wal". Default
	// "pgrelay". One relay streams it at a time; the others wait as
	// standbys and take over when it stops or is cut off.
	WALSlot string
	// WALAllowUnboundedSlot lets the relay create its slot while the
	// server's max_slot_wal_keep_size is -1 (unlimited). Default false: it
	// refuses, because a relay stopped for long would keep WAL until the
	// disk fills.
	WALAllowUnboundedSlot bool
	// WALTruncateInterval is how often the streaming relay of Capture "wal"
	// empties pgrelay.outbox_wal with TRUNCATE (docs/wal.md). Default 1m;
	// negative: never.
	WALTruncateInterval time.Duration

	// MetricsAddr serves /metrics, /healthz and /readyz, for example ":9090".
	// Default "": not served.
	MetricsAddr string
	// AdminAddr serves the admin API (outbox stats, dead events, retry), for
	// example "127.0.0.1:9190". Default "": not served.
	AdminAddr string
	// AdminToken is the bearer token the admin API requires: at least 16
	// characters; required when AdminAddr is not a loopback address.
	AdminToken string
	// StartupTimeout bounds the database check at start-up. Default
	// DefaultStartupTimeout (30s).
	StartupTimeout time.Duration
	// Logger receives the logs. Default: none.
	Logger *slog.Logger
}

// configError is a *setting.FieldError of a Config field.
func configError(field, format string, args ...any) error {
	return setting.Errorf("relay", "relay.Config", field, format, args...)
}

// publicError names the engine's fields (the same names) as relay.Config's.
func publicError(err error) error {
	return setting.Map(err, func(fe *setting.FieldError) error {
		if fe.Struct != "Config" { // not the engine's: a subscriber's, a publisher's, already ours
			return fe
		}
		return fe.Renamed("relay.Config", func(f string) string {
			if rest, ok := strings.CutPrefix(f, "WAL."); ok {
				return "WAL" + rest // engine.Config.WAL.Slot is relay.Config.WALSlot
			}
			return f
		})
	})
}

// Relay publishes the outbox; create it with New and run it with Run.
type Relay struct {
	cfg     Config
	log     *slog.Logger
	r       *engine.Relay
	reg     *prometheus.Registry
	running atomic.Bool
	started chan struct{}
	ops     *endpoints.Running
}

// engine converts c to the engine's configuration.
func (c Config) engine(log *slog.Logger, observer engine.Observer) engine.Config {
	return engine.Config{
		Pool: c.Pool, Publisher: c.Publisher, Logger: log, Observer: observer,
		NodeID: c.NodeID, BatchSize: c.BatchSize, Lease: c.Lease, HeartbeatInterval: c.HeartbeatInterval,
		PollInterval: c.PollInterval, PublishTimeout: c.PublishTimeout, QueryTimeout: c.QueryTimeout,
		ListenConnConfig: c.ListenConnConfig, NoListen: c.NoListen,
		BackoffMin: c.BackoffMin, BackoffMax: c.BackoffMax, Retention: c.Retention,
		RetentionInterval: c.RetentionInterval, RetentionBatchSize: c.RetentionBatchSize,
		StatisticsInterval: c.StatisticsInterval,
		Capture:            c.Capture,
		WAL:                engine.WALConfig{Slot: c.WALSlot, AllowUnboundedSlot: c.WALAllowUnboundedSlot, TruncateInterval: c.WALTruncateInterval},
		AsyncMarks:         c.AsyncMarks,
		StandbyNames:       c.StandbyNames,
	}
}

// Validate checks every setting but Pool and Publisher (which New
// requires), without connecting to anything; each error names its Config
// field.
func (c Config) Validate() error {
	var errs []error
	if err := c.engine(nil, nil).WithDefaults().Validate(); err != nil {
		errs = append(errs, publicError(err))
	}
	if c.StartupTimeout < 0 {
		errs = append(errs, configError("StartupTimeout", "{} %s must be positive", c.StartupTimeout))
	}
	for _, f := range []struct{ field, addr string }{{"MetricsAddr", c.MetricsAddr}, {"AdminAddr", c.AdminAddr}} {
		if f.addr == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(f.addr); err != nil {
			errs = append(errs, configError(f.field, "{} %q: %w", f.addr, err))
		}
	}
	if c.AdminAddr != "" {
		if loopback, err := adminhttp.IsLoopback(c.AdminAddr); err == nil && !loopback && c.AdminToken == "" {
			errs = append(errs, configError("AdminToken", "{} is required: {AdminAddr} %q is not a loopback address", c.AdminAddr))
		}
	}
	if c.AdminToken != "" && len(c.AdminToken) < 16 {
		errs = append(errs, configError("AdminToken", "{} must be at least 16 characters"))
	}
	return errors.Join(errs...)
}

// New checks cfg and builds a relay; it connects to nothing until Run.
// Every invalid setting is reported, each naming its Config field.
func New(cfg Config) (*Relay, error) {
	if cfg.StartupTimeout == 0 {
		cfg.StartupTimeout = DefaultStartupTimeout
	}
	var errs []error
	if cfg.Pool == nil {
		errs = append(errs, configError("Pool", "{} is required"))
	}
	if cfg.Publisher == nil {
		errs = append(errs, configError("Publisher", "{} is required"))
	}
	if err := cfg.Validate(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	log := logbridge.Or(cfg.Logger)
	reg := metrics.NewRegistry()
	ecfg := cfg.engine(log, metrics.NewRelayObserver(reg))
	ecfg.WAL.Observer = metrics.NewWALObserver(reg)
	r, err := engine.New(ecfg)
	if err != nil {
		return nil, publicError(err)
	}
	return &Relay{cfg: cfg, log: log, r: r, reg: reg, started: make(chan struct{})}, nil
}

// NodeID returns the name this relay owns partitions under.
func (r *Relay) NodeID() string { return r.r.NodeID() }

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
	runErr := r.r.Run(ctx)
	stop() // Run returned on its own: stop the operator endpoints too
	return errors.Join(runErr, ops.Wait())
}

// checkDatabase fails start-up when the database cannot be reached or lacks
// the migrations: relaying on a partial schema would only loop on errors.
func (r *Relay) checkDatabase(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.StartupTimeout)
	defer cancel()
	if err := r.cfg.Pool.Ping(ctx); err != nil {
		if p := pooler.RefusedParameter(err); p != "" {
			return configError("Pool", "{}: the server refused the start-up parameter %s, as a connection pooler (PgBouncer) does: "+
				"leave it out of the pool's RuntimeParams (docs/pooler.md): %w", p, err)
		}
		return configError("Pool", "{}: cannot reach PostgreSQL: %w", err)
	}
	sqlDB := stdlib.OpenDBFromPool(r.cfg.Pool)
	defer sqlDB.Close()
	if err := migrations.Check(ctx, sqlDB); err != nil {
		if pooler.StatementClash(err) {
			return configError("Pool", "{}: %w: a connection pooler in transaction mode shares server connections: "+
				"set the pool's ConnConfig.DefaultQueryExecMode to pgx.QueryExecModeCacheDescribe (docs/pooler.md)", err)
		}
		return configError("Pool", "{}: %w; apply the migrations first", err)
	}
	return nil
}

// WALStatus returns the replication slot's status (lag, wal_status, whether
// this relay streams it) as of the last heartbeat, and false when Capture is
// not "wal" or the relay has not looked yet.
func (r *Relay) WALStatus() (engine.WALSlotStatus, bool) { return r.r.WALStatus() }

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
