package relay

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/internal/setting"
)

// Config configures a Relay.
type Config struct {
	// Pool is the PostgreSQL pool holding the outbox. Required. The relay
	// holds one of its connections for LISTEN.
	Pool *pgxpool.Pool
	// ListenConnConfig, when set, is the connection LISTEN and the lock
	// session are dialled with instead of the pool's settings: a direct
	// connection to PostgreSQL for a pool behind a pooler in transaction
	// mode. Default: the pool's.
	ListenConnConfig *pgx.ConnConfig
	// NoListen turns LISTEN/NOTIFY wake-ups and the lock session off: idle
	// partitions find new rows every PollInterval, partitions another relay
	// released are taken at the next heartbeat, and a crashed relay's when
	// their leases expire. For a pool behind a pooler in transaction mode,
	// where LISTEN and session locks do not work, without ListenConnConfig.
	NoListen bool
	// Publisher publishes the events. Required. The relay does not close it.
	Publisher broker.Publisher
	// Logger receives the relay's logs. Default: a no-op logger.
	Logger *slog.Logger
	// Observer receives metrics events. Default: NopObserver.
	Observer Observer
	// NodeID names this relay in relay_partitions.owner; it must be unique
	// among running relays. Default: "<hostname>-<pid>-<random>".
	NodeID string
	// BatchSize is the most rows read, published and marked at once per
	// partition. Default: DefaultBatchSize; at most 10,000.
	BatchSize int
	// Lease is how long a partition lease lasts without renewal; a crashed
	// relay's partitions are taken over after it, or about a second after
	// its lock session ended (session.go). Default: 15s.
	Lease time.Duration
	// HeartbeatInterval is how often leases are renewed and partitions
	// rebalanced; at most half of Lease. Default: Lease/3.
	HeartbeatInterval time.Duration
	// PollInterval is how often an idle partition looks for rows when no
	// notification arrives (LISTEN/NOTIFY is the fast path). Default: 1s.
	PollInterval time.Duration
	// PublishTimeout bounds publishing one batch and awaiting its
	// acknowledgements. Default: 30s.
	PublishTimeout time.Duration
	// QueryTimeout bounds each database statement. Default: 10s.
	QueryTimeout time.Duration
	// BackoffMin is the first pause of a partition after a transient
	// failure; it doubles up to BackoffMax, with jitter. Default: 100ms.
	BackoffMin time.Duration
	// BackoffMax caps the pause after repeated failures. Default: 30s.
	BackoffMax time.Duration
	// Retention is how long published rows are kept before deletion; dead
	// rows are never deleted. A negative value disables deletion.
	// Default: 24h.
	Retention time.Duration
	// RetentionInterval is how often published rows past Retention are
	// deleted. Default: 1m.
	RetentionInterval time.Duration
	// StatisticsInterval is how often Run checks whether the outbox's
	// planner statistics went stale (changed by 20 % of its rows and at least
	// 1,000 since the last ANALYZE or autovacuum) and analyzes it then
	// (maintenance.Statistics). Default: 5s; negative: never.
	StatisticsInterval time.Duration
	// RetentionBatchSize is how many rows one delete statement removes, so
	// deletion never holds long locks. Default: 1,000.
	RetentionBatchSize int
	// AsyncMarks lets each batch's mark commit without waiting for its WAL
	// flush (synchronous_commit off for its own transaction). A mark that a
	// server crash loses leaves its rows pending, and they are published
	// again, deduplicated by the broker (Nats-Msg-Id) or the inbox, as after
	// a relay crash between publish and mark. Off by default: on a disk whose
	// flush is slow, the WAL writer's flushes of the asynchronous marks made
	// the other commits (the producers', the consumer's) wait longer.
	AsyncMarks bool
	// StandbyNames, when set, holds each batch of table capture until every
	// standby named (its application_name in pg_stat_replication) has
	// flushed the WAL past the batch's commits, so that a failover to one
	// of them never leaves an event published for a commit the promoted
	// server lacks (docs/operations.md, "Failover"). With no such standby
	// connected nothing is published. Default: none, publish at commit.
	StandbyNames []string

	// Capture is where the relay reads events from: CaptureTable (the
	// default), the outbox table, or CaptureWAL, the events producers write
	// to the WAL with pgrelay.Emit, read from a logical replication slot
	// (docs/wal.md).
	Capture string
	// WAL configures CaptureWAL.
	WAL WALConfig

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
	// pollRead runs in pollBusy after its read of the lingering
	// partitions (rows in all), before it hands their rows over.
	pollRead func(partitions []int32, rows int)
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
)

// WithDefaults returns the config with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Observer == nil {
		c.Observer = NopObserver{}
	}
	if c.NodeID == "" {
		host, _ := os.Hostname()
		b := make([]byte, 3)
		_, _ = rand.Read(b)
		c.NodeID = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b))
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = c.Lease / 3
	}
	if c.PollInterval == 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = DefaultPublishTimeout
	}
	if c.QueryTimeout == 0 {
		c.QueryTimeout = DefaultQueryTimeout
	}
	if c.BackoffMin == 0 {
		c.BackoffMin = DefaultBackoffMin
	}
	if c.BackoffMax == 0 {
		c.BackoffMax = DefaultBackoffMax
	}
	if c.Retention == 0 {
		c.Retention = DefaultRetention
	}
	if c.RetentionInterval == 0 {
		c.RetentionInterval = DefaultRetentionInterval
	}
	if c.RetentionBatchSize == 0 {
		c.RetentionBatchSize = DefaultRetentionBatchSize
	}
	return c.captureDefaults()
}

func (c Config) validate() error {
	switch {
	case c.Pool == nil:
		return bad("Pool", "{} is required")
	case c.Publisher == nil:
		return bad("Publisher", "{} is required")
	}
	return c.Validate()
}

// bad returns the *setting.FieldError of a Config field.
func bad(field, format string, args ...any) error {
	return setting.Errorf("relay", "Config", field, format, args...)
}

// Validate checks every field but Pool and Publisher (which New requires as
// well), so that a service can reject bad settings before it connects. Call
// it on the result of WithDefaults. The error is a *setting.FieldError naming
// the field.
func (c Config) Validate() error {
	switch {
	case c.BatchSize < 1 || c.BatchSize > 10000:
		return bad("BatchSize", "{} must be between 1 and 10000, got %d", c.BatchSize)
	case c.Lease < 100*time.Millisecond:
		return bad("Lease", "{} must be at least 100ms, got %s", c.Lease)
	case c.HeartbeatInterval <= 0 || c.HeartbeatInterval > c.Lease/2:
		return bad("HeartbeatInterval", "{} must be positive and at most half of {Lease} (%s), got %s", c.Lease, c.HeartbeatInterval)
	case c.PollInterval <= 0:
		return bad("PollInterval", "{} must be positive, got %s", c.PollInterval)
	case c.PublishTimeout <= 0:
		return bad("PublishTimeout", "{} must be positive, got %s", c.PublishTimeout)
	case c.QueryTimeout <= 0:
		return bad("QueryTimeout", "{} must be positive, got %s", c.QueryTimeout)
	case c.BackoffMin <= 0 || c.BackoffMax < c.BackoffMin:
		return bad("BackoffMin", "{} (%s) must be positive and at most {BackoffMax} (%s)", c.BackoffMin, c.BackoffMax)
	case c.RetentionInterval <= 0:
		return bad("RetentionInterval", "{} must be positive, got %s", c.RetentionInterval)
	case c.RetentionBatchSize < 1:
		return bad("RetentionBatchSize", "{} must be positive, got %d", c.RetentionBatchSize)
	}
	if err := c.validateStandbyNames(); err != nil {
		return err
	}
	return c.validateCapture()
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
