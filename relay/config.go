package relay

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/internal/admin/adminhttp"
	"github.com/pgrelay/pgrelay/internal/logbridge"
	"github.com/pgrelay/pgrelay/internal/setting"
)

// Config configures a Relay. The zero value of every optional field means
// the default it documents. Errors name the fields as relay.Config.<Field>.
type Config struct {
	// Pool is the PostgreSQL database holding the outbox (migrated). Required.
	// Give it PoolConns(partitions) connections; the relay dials two more,
	// for LISTEN and for its lock session (unless NoListen).
	Pool *pgxpool.Pool
	// Databases are the databases whose outboxes the relay publishes, each
	// with its own partitions and leases, instead of Pool (give one or the
	// other): Pool is shorthand for one Database named after its database
	// name, with ListenConnConfig. Names are unique, 1-63 of
	// [A-Za-z0-9_.-] (the metrics' database label). Capture "wal" serves one.
	Databases []Database
	// InFlightEvents is how many events the relay fleet has handed to the
	// broker and not yet seen acknowledged, all databases together: each
	// relay takes InFlightEvents/N, N the most relays alive in any of its
	// databases, and while k of its databases publish, each may have 1/k of
	// that in flight (always one batch). So one database's backlog fills
	// only its share of the broker's pipe, and another's batch waits behind
	// about InFlightEvents events at most. A relay serving one database is
	// not bounded. Default DefaultInFlightEvents (500: at 2,000 another
	// database's events queued behind a backlog about twice as long, for a
	// drain about 15 % faster).
	InFlightEvents int
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

	// MetricsAddr serves /metrics, /livez (also /healthz) and /readyz, for example ":9090".
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

	// Set by New (or by this package's tests): the engine's logger, made
	// from Logger, and its metrics.
	log    *slog.Logger
	obs    relayObserver
	walObs walObserver
	// The WAL capture's tuning, defaulted by withDefaults.
	walPublication string
	walConnConfig  *pgconn.Config
	walStandbyPoll time.Duration
	walLockTimeout time.Duration

	// Set by New for each database's engine: its name, where its metrics
	// are registered, and the gate its publishing passes.
	database   string
	registerer prometheus.Registerer
	gate       *gate

	hooks hooks
}

// hooks lets tests stop the relay at precise points.
type hooks struct {
	beforePublish   func(partition int32)
	afterPublish    func(partition int32, ids []int64)
	beforeHeartbeat func()
	afterArm        func(partition int32)
	armWait         func(partition int32)
	afterRead       func(partition int32, rows int)
	// lingerFor replaces the constant lingerFor when positive.
	lingerFor time.Duration
	// lingerMinRows replaces the constant lingerMinRows when positive.
	lingerMinRows int
	// sweep runs after each sweepIdle statement, with the partitions it
	// polled.
	sweep func(partitions []int32)
	// roundWait replaces the constant roundWait when positive.
	roundWait time.Duration
	// walCoalesce replaces the constant walCoalesce when positive.
	walCoalesce time.Duration
	// schemaInterval replaces the constant schemaInterval when positive.
	schemaInterval time.Duration
	// schemaNoted is called with each schema version read, once the engine
	// acts on it (floorReady set).
	schemaNoted func(current int64)
	// pollRead runs in pollBusy after its read of the lingering
	// partitions (rows in all), before it hands their rows over.
	pollRead func(partitions []int32, rows int)
	// pollStart runs in pollBusy right before each read.
	pollStart func()
	// lingerWoke runs each time a lingering worker wakes up.
	lingerWoke func(partition int32)
	// The WAL capture's: before each status update, before each publish,
	// right before numbering a batch's keyed events (its freshness checked).
	walBeforeStatus  func()
	walBeforePublish func(events int)
	walBeforeNumber  func()
	// walBeforeTruncate runs in the transaction that empties
	// pgrelay.outbox_wal, before its TRUNCATE.
	walBeforeTruncate func()
	beforeMark        func(partition int32, ids []int64)
	// floorOff makes every claim scan from the start (no scanFloor);
	// floorFullEvery replaces floorFullEvery and floorMaxEvery when
	// positive; claimFrom runs before each claim with where it starts.
	floorOff       bool
	floorFullEvery time.Duration
	claimFrom      func(partition int32, after int64)
	// beforeMarkStatement runs in the marker before each statement, with
	// the partitions whose marks it carries.
	beforeMarkStatement func(partitions []int32)
}

// Defaults for Config; the relay command's flags default to them too.
const (
	DefaultBatchSize          = 500
	DefaultLease              = 15 * time.Second
	DefaultPollInterval       = time.Second
	DefaultPublishTimeout     = 30 * time.Second
	DefaultQueryTimeout       = 10 * time.Second
	DefaultBackoffMin         = 100 * time.Millisecond
	DefaultBackoffMax         = 30 * time.Second
	DefaultRetention          = 24 * time.Hour
	DefaultRetentionInterval  = time.Minute
	DefaultRetentionBatchSize = 1000
	DefaultStartupTimeout     = 30 * time.Second
	DefaultInFlightEvents     = 500
)

// withDefaults returns the config with every zero field set to its default.
func (c Config) withDefaults() Config {
	if c.log == nil {
		c.log = logbridge.Or(c.Logger)
	}
	if c.obs == nil {
		c.obs = nopObserver{}
	}
	if c.NodeID == "" {
		host, _ := os.Hostname()
		b := make([]byte, 3)
		_, _ = rand.Read(b)
		c.NodeID = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b))
	}
	c.BatchSize = or(c.BatchSize, DefaultBatchSize)
	c.Lease = or(c.Lease, DefaultLease)
	c.HeartbeatInterval = or(c.HeartbeatInterval, c.Lease/3)
	c.PollInterval = or(c.PollInterval, DefaultPollInterval)
	c.PublishTimeout = or(c.PublishTimeout, DefaultPublishTimeout)
	c.QueryTimeout = or(c.QueryTimeout, DefaultQueryTimeout)
	c.BackoffMin = or(c.BackoffMin, DefaultBackoffMin)
	c.BackoffMax = or(c.BackoffMax, DefaultBackoffMax)
	c.Retention = or(c.Retention, DefaultRetention)
	c.RetentionInterval = or(c.RetentionInterval, DefaultRetentionInterval)
	c.RetentionBatchSize = or(c.RetentionBatchSize, DefaultRetentionBatchSize)
	c.StartupTimeout = or(c.StartupTimeout, DefaultStartupTimeout)
	c.InFlightEvents = or(c.InFlightEvents, DefaultInFlightEvents)
	return c.captureDefaults()
}

// or is v, or def when v is zero (unlike cmp.Or, a negative v is kept).
func or[T int | time.Duration](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}

// bad returns the *setting.FieldError of a Config field.
func bad(field, format string, args ...any) error {
	return setting.Errorf("relay", "relay.Config", field, format, args...)
}

// Validate checks every setting but Pool and Publisher (which New
// requires), without connecting to anything; each error names its Config
// field.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	check := func(failed bool, field, format string, args ...any) {
		if failed {
			errs = append(errs, bad(field, format, args...))
		}
	}
	check(c.BatchSize < 1 || c.BatchSize > 10000, "BatchSize", "{} must be between 1 and 10000, got %d", c.BatchSize)
	check(c.Lease < 100*time.Millisecond, "Lease", "{} must be at least 100ms, got %s", c.Lease)
	check(c.HeartbeatInterval <= 0 || c.HeartbeatInterval > c.Lease/2, "HeartbeatInterval",
		"{} must be positive and at most half of {Lease} (%s), got %s", c.Lease, c.HeartbeatInterval)
	check(c.PollInterval <= 0, "PollInterval", "{} must be positive, got %s", c.PollInterval)
	check(c.PublishTimeout <= 0, "PublishTimeout", "{} must be positive, got %s", c.PublishTimeout)
	check(c.QueryTimeout <= 0, "QueryTimeout", "{} must be positive, got %s", c.QueryTimeout)
	check(c.BackoffMin <= 0 || c.BackoffMax < c.BackoffMin, "BackoffMin",
		"{} (%s) must be positive and at most {BackoffMax} (%s)", c.BackoffMin, c.BackoffMax)
	check(c.RetentionInterval <= 0, "RetentionInterval", "{} must be positive, got %s", c.RetentionInterval)
	check(c.RetentionBatchSize < 1, "RetentionBatchSize", "{} must be positive, got %d", c.RetentionBatchSize)
	check(c.InFlightEvents < 1, "InFlightEvents", "{} must be positive, got %d", c.InFlightEvents)
	check(c.StartupTimeout < 0, "StartupTimeout", "{} %s must be positive", c.StartupTimeout)
	for _, f := range []struct{ field, addr string }{{"MetricsAddr", c.MetricsAddr}, {"AdminAddr", c.AdminAddr}} {
		if f.addr == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(f.addr); err != nil {
			errs = append(errs, bad(f.field, "{} %q: %w", f.addr, err))
		}
	}
	if c.AdminAddr != "" {
		loopback, err := adminhttp.IsLoopback(c.AdminAddr)
		check(err == nil && !loopback && c.AdminToken == "", "AdminToken", "{} is required: {AdminAddr} %q is not a loopback address", c.AdminAddr)
	}
	check(c.AdminToken != "" && len(c.AdminToken) < 16, "AdminToken", "{} must be at least 16 characters")
	errs = append(errs, c.validateStandbyNames(), c.validateCapture(), validateDatabases(c.Pool, c.Databases, c.Capture))
	return errors.Join(errs...)
}

func (c Config) validateStandbyNames() error {
	if len(c.StandbyNames) == 0 {
		return nil
	}
	if c.Capture == CaptureWAL {
		return bad("StandbyNames", "{} applies to table capture only, not to {Capture} %q", c.Capture)
	}
	seen := map[string]bool{}
	for _, n := range c.StandbyNames {
		switch {
		case n == "" || strings.TrimSpace(n) != n:
			return bad("StandbyNames", "{} holds an empty name or one with surrounding spaces: %q", n)
		case len(n) > 63:
			return bad("StandbyNames", "{}: %q is longer than an application_name (63 bytes)", n)
		case seen[n]:
			return bad("StandbyNames", "{} names %q twice", n)
		}
		seen[n] = true
	}
	return nil
}
