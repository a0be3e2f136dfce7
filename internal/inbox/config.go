package inbox

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/internal/setting"
)

// Config configures a Worker. Zero fields take the documented defaults.
type Config struct {
	// Pool is the database the inbox lives in. Required.
	Pool *pgxpool.Pool
	// ListenConnConfig, when set, is the connection LISTEN is dialled with
	// instead of the pool's settings: a direct connection to PostgreSQL for
	// a pool behind a pooler in transaction mode. Default: the pool's.
	ListenConnConfig *pgx.ConnConfig
	// NoListen turns LISTEN/NOTIFY wake-ups off: events another process
	// stored are found every PollInterval. For a pool behind a pooler in
	// transaction mode, where LISTEN does not work, without ListenConnConfig.
	NoListen bool
	// Handler runs each event's side effect. Required.
	Handler Handler
	// HandlerName names the handler: the worker claims only the inbox rows
	// stored for it (Receive's targets), so several handlers in one database
	// each process an event once, with their own status, attempts, lease and
	// dead letters. Default DefaultHandlerName ("default").
	HandlerName string
	// Logger receives the worker's logs. Default: a no-op logger.
	Logger *slog.Logger
	// Observer is told about every state change, for metrics. Default: NopObserver.
	Observer Observer
	// WorkerID is recorded as locked_by on claimed rows. Default:
	// "hostname-pid-random".
	WorkerID string
	// Workers is how many batches run concurrently, each on its own
	// connection. Default: 4.
	Workers int
	// BatchSize is the most events claimed and processed in one transaction.
	// Default: 50. Maximum: 10000.
	BatchSize int
	// Lease is how long a claim is exclusive; an event still processing after
	// it may be taken over by another worker, and this worker is then fenced.
	// Default: 30s. Must exceed HandlerTimeout.
	Lease time.Duration
	// HandlerTimeout bounds one handler call. Default: 10s.
	HandlerTimeout time.Duration
	// MaxAttempts is the number of attempts before an event goes dead.
	// Default: 10.
	MaxAttempts int
	// BackoffMin is the wait after the first failed attempt. Default: 1s.
	BackoffMin time.Duration
	// BackoffMax caps the exponential backoff between attempts. Default: 5m.
	BackoffMax time.Duration
	// MaxDeferrals is how often one event may be deferred before it goes dead.
	// Default: 20.
	MaxDeferrals int
	// DeferFallback is when a deferred event runs again if its dependency is
	// never released. Default: 1m.
	DeferFallback time.Duration
	// PollInterval is the mean interval between polls for due events (jittered
	// ±50%), the fallback behind LISTEN/NOTIFY and for retries coming due.
	// Default: 1s.
	PollInterval time.Duration
	// QueryTimeout bounds each inbox query outside handlers. Default: 10s.
	QueryTimeout time.Duration
	// ShutdownTimeout is how long in-flight batches may run on after Run's
	// context is cancelled; then they are rolled back and their claims handed
	// back (pending, attempt refunded). Default: 10s.
	ShutdownTimeout time.Duration
	// Retention is the inbox's upkeep, which Run runs beside the workers
	// unless Retention.Disabled: processed rows past the dedup window (7 days
	// by default), old Release records, key conflicts, the duplicate record.
	// Its Pool and Logger default to this Config's, its ReleaseHorizon to ten
	// leases (at least 10m).
	Retention RetentionConfig
	// Ordered applies the events of one key strictly in their per-key
	// sequence (Message.KeySeq, the Pgrelay-Key-Seq header): a key's later
	// event never runs while an earlier one is unapplied (missing, retrying
	// or dead); a sequence at or below the last applied one is absorbed as a
	// duplicate without running the handler. Events without a sequence are
	// applied unordered. Default: false (every event applied as soon as it is
	// due). See ordered.go.
	Ordered bool
	// GapTimeout is how long, in ordered mode, a key may wait for a missing
	// sequence before the gap is reported (log, metric, stats, admin API);
	// the key keeps waiting until the sequence arrives or an operator skips
	// it. Default: 5m.
	GapTimeout time.Duration
	// StatisticsInterval is how often Run checks whether the inbox's planner
	// statistics went stale (changed by 20 % of its rows and at least 1,000
	// since the last ANALYZE or autovacuum) and analyzes it then; the batch
	// statements' plans depend on them (maintenance.Statistics). Default: 5s;
	// negative: never (leave it to autovacuum).
	StatisticsInterval time.Duration
}

// Defaults for Config.
const (
	DefaultWorkers         = 4
	DefaultBatchSize       = 50
	MaxBatchSize           = 10000
	DefaultLease           = 30 * time.Second
	DefaultHandlerTimeout  = 10 * time.Second
	DefaultMaxAttempts     = 10
	DefaultBackoffMin      = time.Second
	DefaultBackoffMax      = 5 * time.Minute
	DefaultMaxDeferrals    = 20
	DefaultDeferFallback   = time.Minute
	DefaultPollInterval    = time.Second
	DefaultQueryTimeout    = 10 * time.Second
	DefaultShutdownTimeout = 10 * time.Second
	DefaultGapTimeout      = 5 * time.Minute
)

// WithDefaults returns a copy of c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Observer == nil {
		c.Observer = NopObserver{}
	}
	if c.WorkerID == "" {
		c.WorkerID = defaultWorkerID()
	}
	if c.HandlerName == "" {
		c.HandlerName = DefaultHandlerName
	}
	setDefault(&c.Workers, DefaultWorkers)
	setDefault(&c.BatchSize, DefaultBatchSize)
	setDefault(&c.Lease, DefaultLease)
	setDefault(&c.HandlerTimeout, DefaultHandlerTimeout)
	setDefault(&c.MaxAttempts, DefaultMaxAttempts)
	setDefault(&c.BackoffMin, DefaultBackoffMin)
	setDefault(&c.BackoffMax, DefaultBackoffMax)
	setDefault(&c.MaxDeferrals, DefaultMaxDeferrals)
	setDefault(&c.DeferFallback, DefaultDeferFallback)
	setDefault(&c.PollInterval, DefaultPollInterval)
	setDefault(&c.QueryTimeout, DefaultQueryTimeout)
	setDefault(&c.ShutdownTimeout, DefaultShutdownTimeout)
	if c.Retention.Pool == nil {
		c.Retention.Pool = c.Pool
	}
	if c.Retention.Logger == nil {
		c.Retention.Logger = c.Logger.With(slog.String("logger", "inbox"))
	}
	setDefault(&c.Retention.ReleaseHorizon, releaseHorizon(c.Lease))
	c.Retention = c.Retention.WithDefaults()
	setDefault(&c.GapTimeout, DefaultGapTimeout)
	return c
}

func setDefault[T int | time.Duration](p *T, def T) {
	if *p == 0 {
		*p = def
	}
}

// validate checks a Config that WithDefaults has filled; each error is a
// *setting.FieldError naming the field.
func (c Config) validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, setting.Errorf("inbox", "Config", field, "{} "+format, args...))
	}
	if c.Pool == nil {
		bad("Pool", "is required")
	}
	if c.Handler == nil {
		bad("Handler", "is required")
	}
	if err := ValidateHandlerName(c.HandlerName); err != nil {
		bad("HandlerName", "%v", err)
	}
	if len(c.WorkerID) > 200 {
		bad("WorkerID", "is longer than 200 bytes")
	}
	if c.Workers < 1 || c.Workers > 1000 {
		bad("Workers", "must be between 1 and 1000, got %d", c.Workers)
	}
	if c.BatchSize < 1 || c.BatchSize > MaxBatchSize {
		bad("BatchSize", "must be between 1 and %d, got %d", MaxBatchSize, c.BatchSize)
	}
	positive := map[string]time.Duration{
		"Lease": c.Lease, "HandlerTimeout": c.HandlerTimeout, "BackoffMin": c.BackoffMin,
		"BackoffMax": c.BackoffMax, "DeferFallback": c.DeferFallback, "PollInterval": c.PollInterval,
		"QueryTimeout": c.QueryTimeout, "ShutdownTimeout": c.ShutdownTimeout, "GapTimeout": c.GapTimeout,
	}
	for _, name := range []string{"Lease", "HandlerTimeout", "BackoffMin", "BackoffMax", "DeferFallback",
		"PollInterval", "QueryTimeout", "ShutdownTimeout", "GapTimeout"} {
		if positive[name] < 0 {
			bad(name, "must be positive, got %s", positive[name])
		}
	}
	if c.HandlerTimeout >= c.Lease {
		bad("HandlerTimeout", "(%s) must be shorter than {Lease} (%s)", c.HandlerTimeout, c.Lease)
	}
	if c.BackoffMax < c.BackoffMin {
		bad("BackoffMax", "(%s) must not be below {BackoffMin} (%s)", c.BackoffMax, c.BackoffMin)
	}
	if c.MaxAttempts < 1 {
		bad("MaxAttempts", "must be at least 1, got %d", c.MaxAttempts)
	}
	if c.MaxDeferrals < 1 {
		bad("MaxDeferrals", "must be at least 1, got %d", c.MaxDeferrals)
	}
	if !c.Retention.Disabled {
		errs = append(errs, c.Retention.validate())
	}
	return errors.Join(errs...)
}

func (c Config) policy() policy {
	return policy{
		maxAttempts: c.MaxAttempts, maxDeferrals: c.MaxDeferrals,
		backoffMin: c.BackoffMin, backoffMax: c.BackoffMax, deferFallback: c.DeferFallback,
	}
}

func defaultWorkerID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}
