package consumer

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/internal/admin/adminhttp"
	"github.com/pgrelay/pgrelay/internal/logbridge"
	"github.com/pgrelay/pgrelay/internal/setting"
)

// Defaults for Config.
const (
	DefaultFetchBatchSize = 100
	DefaultMaxWait        = 500 * time.Millisecond
	// DefaultIngestLoops is Config.IngestLoops' default: one batch at a
	// time. More loops did not measurably help on the two-core benchmark
	// machine, where smaller, more numerous commits cost the CPU they saved
	// in waiting (docs/benchmarks.md).
	DefaultIngestLoops = 1
	// DefaultAsyncFlushAfter is Config.AsyncFlushAfter's default.
	DefaultAsyncFlushAfter = 5 * time.Millisecond
	DefaultStatsInterval   = 30 * time.Second
	DefaultStartupTimeout  = 30 * time.Second
	// DefaultRetryMin and DefaultRetryMax are Config.RetryMin's and
	// RetryMax's defaults.
	DefaultRetryMin = 100 * time.Millisecond
	DefaultRetryMax = 5 * time.Second
	// DefaultMaxPayloadBytes is the payload limit a command-line consumer
	// gives its subscriber (the adapters' Config.MaxPayloadBytes); a larger
	// message is stored dead.
	DefaultMaxPayloadBytes = 1 << 20
)

// Config configures a Consumer. The zero value of every optional field means
// the default it documents. Errors name the fields as consumer.Config.<Field>.
type Config struct {
	// Pool is the PostgreSQL database holding the inbox (migrated with
	// `relay migrate up` or the migrations package). Required. Give it at
	// least Inbox.Workers+IngestLoops+3 connections.
	Pool *pgxpool.Pool
	// Subscribe creates the subscriber the consumer fetches from, for
	// example broker.Subscribe(nats.NewSubscriber, nats.Config{...}),
	// broker.Subscribe(kafka.NewSubscriber, kafka.Config{...}) or
	// broker.Subscribe(rabbitmq.NewSubscriber, rabbitmq.Config{...}). Run
	// calls it once and closes the subscriber when it returns; an error
	// there (a broker unreachable at start-up) is returned by Run. Consumers
	// of different handlers need subscribers of their own (nats.Config.Durable,
	// kafka.Config.Group, rabbitmq.Config.Queue), so that each handler receives
	// every message; consumers of one handler share one. Required.
	Subscribe func(ctx context.Context) (broker.Subscriber, error)
	// Direct runs the consumer without a broker, for a relay that stores
	// events straight into this database's inbox (relay --broker postgres,
	// broker/postgres): Run calls Register, then runs the inbox workers
	// only, woken by the relay's NOTIFY. Subscribe must then be nil. See
	// docs/postgres-broker.md. Default false.
	Direct bool
	// Register, required with Direct, records the handlers (Targets, or
	// Inbox.HandlerName with DedupKey) in pgrelay.inbox_subscriptions for
	// the relay that stores into this inbox: postgres.RegisterTargets(Pool,
	// topics, targets...). Run retries it while the database is down.
	Register func(ctx context.Context) error
	// Inbox configures the inbox workers that run the handler in this
	// process, as pgrelay.NewInboxWorker takes it: Inbox.Handler is
	// required; Inbox.HandlerName names the handler the received messages
	// are stored for (with DedupKey); Inbox.Retention.Window is the dedup
	// window. Inbox.Pool defaults to Pool, Inbox.Logger to Logger.
	// Inbox.Observer is told about the workers as well as the metrics.
	Inbox pgrelay.InboxConfig
	// DedupKey is the key strategy spec of the handler's rows (see
	// pgrelay.Target.DedupKey). Default "message-id".
	DedupKey string
	// DedupKeyByTopic overrides DedupKey for the messages of the named
	// topics: topic → key strategy spec. Default: none.
	DedupKeyByTopic map[string]string
	// Targets, when set, are the handlers each received message is stored
	// for (one row each, in one statement), for a consumer whose ingest feeds
	// several handlers; Inbox.HandlerName must be among them (DedupKey and
	// DedupKeyByTopic are then unused). Default: Inbox.HandlerName with
	// DedupKey.
	Targets []pgrelay.Target

	// FetchBatchSize is how many messages one fetch asks for, stored in one
	// transaction. Default DefaultFetchBatchSize (100).
	FetchBatchSize int
	// MaxWait is how long an idle fetch waits; it also bounds shutdown.
	// Default DefaultMaxWait (500ms).
	MaxWait time.Duration
	// IngestLoops is how many fetched batches are stored at once, each in
	// its own transaction on its own connection and acknowledged after its
	// own commit, while the next batch is fetched. 1 stores one batch at a
	// time (fetch, store, commit, ack). Default DefaultIngestLoops (1); at
	// most 64. Each loop beyond the first holds one more connection of Pool
	// while it stores.
	IngestLoops int
	// StatsInterval is how often the ingest counters are logged; negative
	// disables. Default DefaultStatsInterval (30s).
	StatsInterval time.Duration
	// DupRateWarn is the share of deliveries absorbed as duplicates (0..1)
	// over one stats interval above which "high duplicate rate" is logged at
	// warn. Default 0: no warning.
	DupRateWarn float64
	// NoApplyOnReceive turns off applying on receive. By default the events
	// of every fetched batch of first deliveries are stored and their
	// handler run in one transaction, so that an event is written once and
	// never claimed; whatever fails there (an error, a deferral, a panic) is
	// rolled back and left to the workers, uncounted as an attempt. With
	// this set the workers take every event (several connections at once:
	// a slow handler under a broker backlog). Default false.
	NoApplyOnReceive bool
	// AsyncCommit commits each fetched batch's store transaction with
	// synchronous_commit off (for that transaction only), so that the
	// commit does not wait for the WAL flush and the next fetch starts at
	// once; the batch is acknowledged only once the server has flushed its
	// WAL past the commit, so a server crash that loses the commit leaves
	// the messages with the broker, which redelivers them. One more
	// connection, opened with Pool's settings, reads the flushed position;
	// it must reach PostgreSQL itself, not a connection pooler. See
	// docs/consumer.md, "Asynchronous commit". Default false.
	AsyncCommit bool
	// AsyncFlushAfter is how long, with AsyncCommit, an acknowledgement
	// waits for the server to flush the commit (its WAL writer, another
	// transaction) before the consumer forces the flush with a tiny
	// synchronous transaction. Default 5ms.
	AsyncFlushAfter time.Duration

	// RetryMin and RetryMax bound the exponential backoff after a failed
	// fetch, store or connect: it doubles from RetryMin up to RetryMax, each
	// wait jittered ×0.5–1.5. Defaults DefaultRetryMin and DefaultRetryMax.
	RetryMin, RetryMax time.Duration

	// MetricsAddr serves /metrics, /livez (also /healthz) and /readyz, for example ":9091".
	// Default "": not served.
	MetricsAddr string
	// AdminAddr serves the admin API (stats, dead letters, replay), for
	// example "127.0.0.1:9191". Default "": not served.
	AdminAddr string
	// AdminToken is the bearer token the admin API requires: at least 16
	// characters; required when AdminAddr is not a loopback address.
	// Default "".
	AdminToken string
	// StartupTimeout bounds the database check at start-up. Default
	// DefaultStartupTimeout (30s).
	StartupTimeout time.Duration
	// Logger receives the logs. Default: none.
	Logger *slog.Logger

	// The engine's tuning, set by New or by this package's tests.
	// storeTimeout bounds one batch's inbox transaction (default 15s);
	// rateInterval is the interval of the dedup hit ratio and DupRateWarn
	// (default StatsInterval when positive); asyncPollInterval is how often,
	// with AsyncCommit, the acker reads the flushed WAL position (default
	// 1ms); asyncMaxPending is how many stored batches may wait for their
	// flush at once (default 4: keep (asyncMaxPending+IngestLoops+1) ×
	// FetchBatchSize within the broker's limit, NATS MaxAckPending).
	storeTimeout, rateInterval, asyncPollInterval time.Duration
	asyncMaxPending                               int
	// noDuplicateRecord turns off the record of absorbed duplicates.
	noDuplicateRecord bool
	// disableWorkers runs only the ingest side (broker into the inbox).
	disableWorkers bool
	// observeReceive is told the duration of every receive statement;
	// observeConflicts each stored batch's key conflicts per handler.
	observeReceive   func(time.Duration)
	observeConflicts func(handler string, n int)
}

// withDefaults returns a copy of c with every unset optional field set to
// its default.
func (c Config) withDefaults() Config {
	c.Inbox.HandlerName = cmp.Or(c.Inbox.HandlerName, pgrelay.DefaultHandlerName)
	c.FetchBatchSize = cmp.Or(c.FetchBatchSize, DefaultFetchBatchSize)
	c.MaxWait = cmp.Or(c.MaxWait, DefaultMaxWait)
	c.IngestLoops = cmp.Or(c.IngestLoops, DefaultIngestLoops)
	c.StatsInterval = cmp.Or(c.StatsInterval, DefaultStatsInterval)
	c.AsyncFlushAfter = cmp.Or(c.AsyncFlushAfter, DefaultAsyncFlushAfter)
	c.StartupTimeout = cmp.Or(c.StartupTimeout, DefaultStartupTimeout)
	c.RetryMin = cmp.Or(c.RetryMin, DefaultRetryMin)
	c.RetryMax = cmp.Or(c.RetryMax, DefaultRetryMax)
	c.storeTimeout = cmp.Or(c.storeTimeout, 15*time.Second)
	c.rateInterval = cmp.Or(c.rateInterval, max(c.StatsInterval, 0), DefaultStatsInterval)
	c.asyncPollInterval = cmp.Or(c.asyncPollInterval, time.Millisecond)
	c.asyncMaxPending = cmp.Or(c.asyncMaxPending, 4)
	c.Logger = logbridge.Or(c.Logger)
	if c.Inbox.Pool == nil {
		c.Inbox.Pool = c.Pool
	}
	if c.Inbox.Logger == nil {
		c.Inbox.Logger = c.Logger // the worker names its own logger "inbox"
	}
	return c
}

// targets returns the handlers received messages are stored for: Targets,
// or Inbox.HandlerName keyed by DedupKey and DedupKeyByTopic.
func (c Config) targets() []pgrelay.Target {
	if len(c.Targets) > 0 {
		return c.Targets
	}
	return []pgrelay.Target{{Handler: c.Inbox.HandlerName, DedupKey: c.DedupKey, DedupKeyByTopic: c.DedupKeyByTopic}}
}

// configError is a *setting.FieldError of a Config field.
func configError(field, format string, args ...any) error {
	return setting.Errorf("", "consumer.Config", field, format, args...)
}

// validate reports every invalid setting of c (defaulted), each naming its
// Config field.
func (c Config) validate() []error {
	var errs []error
	bad := func(field, format string, args ...any) { errs = append(errs, configError(field, format, args...)) }
	if c.Pool == nil {
		bad("Pool", "{} is required")
	}
	switch {
	case c.Direct && c.Subscribe != nil:
		bad("Subscribe", "{} must be nil with {Direct}: the relay stores into the inbox itself")
	case c.Direct && c.Register == nil:
		bad("Register", "{} is required with {Direct}: postgres.RegisterTargets(pool, topics, targets...) records the handlers for the relay")
	case c.Direct && c.disableWorkers:
		bad("Direct", "{} without the workers would run nothing: a direct consumer runs the inbox workers only")
	case !c.Direct && c.Subscribe == nil:
		bad("Subscribe", "{} is required: broker.Subscribe(nats.NewSubscriber, nats.Config{...}) or another adapter's (or set {Direct})")
	case !c.Direct && c.Register != nil:
		bad("Register", "{} is set without {Direct}")
	}
	if !(c.DupRateWarn >= 0 && c.DupRateWarn <= 1) { // NaN fails too
		bad("DupRateWarn", "{} %g must be between 0 and 1 (0 disables)", c.DupRateWarn)
	}
	if c.FetchBatchSize < 1 || c.FetchBatchSize > 10000 {
		bad("FetchBatchSize", "{} %d must be between 1 and 10000", c.FetchBatchSize)
	}
	if c.MaxWait < 10*time.Millisecond {
		bad("MaxWait", "{} %s must be at least 10ms", c.MaxWait)
	}
	if c.IngestLoops < 1 || c.IngestLoops > 64 {
		bad("IngestLoops", "{} %d must be between 1 and 64", c.IngestLoops)
	}
	if c.AsyncCommit && c.Direct {
		bad("AsyncCommit", "{} is for the batches a subscriber's deliveries are stored in; with {Direct} the relay stores them")
	}
	if c.AsyncFlushAfter < 0 {
		bad("AsyncFlushAfter", "{} %s must be positive", c.AsyncFlushAfter)
	}
	if c.RetryMin <= 0 || c.RetryMax < c.RetryMin {
		bad("RetryMin", "{} %s and {RetryMax} %s must be positive with RetryMin <= RetryMax", c.RetryMin, c.RetryMax)
	}
	if c.StartupTimeout < 0 {
		bad("StartupTimeout", "{} %s must be positive", c.StartupTimeout)
	}
	for field, addr := range map[string]string{"MetricsAddr": c.MetricsAddr, "AdminAddr": c.AdminAddr} {
		if _, _, err := net.SplitHostPort(addr); addr != "" && err != nil {
			bad(field, "{} %q: %w", addr, err)
		}
	}
	if c.AdminAddr != "" {
		if loopback, err := adminhttp.IsLoopback(c.AdminAddr); err == nil && !loopback && c.AdminToken == "" {
			bad("AdminToken", "{} is required: {AdminAddr} %q is not a loopback address", c.AdminAddr)
		}
	}
	if c.AdminToken != "" && len(c.AdminToken) < 16 {
		bad("AdminToken", "{} must be at least 16 characters")
	}
	errs = append(errs, c.checkTargets()...)
	if c.disableWorkers {
		if err := pgrelay.ValidateHandlerName(c.Inbox.HandlerName); err != nil {
			bad("Inbox.HandlerName", "{}: %v", err)
		}
	}
	return errs
}

// checkTargets checks the targets: each key strategy spec (an error names
// Targets[i].DedupKey, or DedupKey and DedupKeyByTopic without Targets), no
// handler named twice, and, with the workers, one of them the workers' own.
// The workers' handler name itself is checked by pgrelay.NewInboxWorker.
func (c Config) checkTargets() []error {
	var errs []error
	for i, t := range c.targets() {
		prefix := ""
		if len(c.Targets) > 0 {
			prefix = fmt.Sprintf("Targets[%d].", i)
		}
		if err := pgrelay.ValidateKeyStrategy(t.DedupKey); err != nil {
			errs = append(errs, configError(prefix+"DedupKey", "{}: %w", err))
		}
		for topic, spec := range t.DedupKeyByTopic {
			if err := pgrelay.ValidateKeyStrategy(spec); err != nil {
				errs = append(errs, configError(prefix+"DedupKeyByTopic", "{}[%q]: %w", topic, err))
			}
		}
	}
	if len(c.Targets) == 0 || len(errs) > 0 {
		return errs
	}
	if err := pgrelay.ValidateTargets(c.Targets); err != nil {
		errs = append(errs, configError("Targets", "{}: %v", err))
	} else if !c.disableWorkers && !slices.ContainsFunc(c.Targets, func(t pgrelay.Target) bool {
		return cmp.Or(t.Handler, pgrelay.DefaultHandlerName) == c.Inbox.HandlerName
	}) {
		errs = append(errs, configError("Targets", "{} does not store rows for the handler the workers run ({Inbox.HandlerName} %q)", c.Inbox.HandlerName))
	}
	return errs
}
