package consumer

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/internal/setting"
)

// Config configures a Consumer. The zero value of every optional field means
// its documented default; WithDefaults fills them in.
type Config struct {
	// Pool is the PostgreSQL pool holding the inbox. Required.
	Pool *pgxpool.Pool
	// Subscribe creates the subscriber the consumer fetches from (see
	// nats.NewSubscriber); Run calls it once and closes the subscriber
	// when it returns. An error is returned by Run: a broker that cannot be
	// reached at start-up is a setting to fix. Required.
	Subscribe func(ctx context.Context) (broker.Subscriber, error)
	// BatchSize is how many deliveries one fetch asks for; each fetched batch
	// is stored in one transaction. Default 100.
	BatchSize int
	// MaxWait is how long an idle fetch waits for a first message (a fetch
	// never waits for a full batch: see the broker's Fetch). It also bounds
	// how long shutdown waits for the fetch in flight. Default 500ms.
	MaxWait time.Duration
	// StoreTimeout bounds one batch's inbox transaction. Default 15s.
	StoreTimeout time.Duration
	// IngestLoops is how many fetched batches are stored at once, each in
	// its own transaction on its own connection and acknowledged after its
	// own commit, the fetch of the next batch overlapping them. 1 stores one
	// batch at a time (fetch, store, commit, ack, then fetch again). Default
	// DefaultIngestLoops; at most 64.
	IngestLoops int
	// RetryMin and RetryMax bound the exponential backoff after a failed
	// fetch, store or connect: it doubles from RetryMin up to RetryMax, each
	// wait jittered ×0.5–1.5. Defaults 100ms and 5s.
	RetryMin, RetryMax time.Duration
	// StatsInterval is how often the consumer logs its counters; negative
	// disables the log. Default 30s.
	StatsInterval time.Duration
	// DupRateWarn is the share of deliveries absorbed as duplicates (0..1)
	// over one rate interval above which "high duplicate rate" is logged at
	// warn. Default 0: no warning.
	DupRateWarn float64
	// RateInterval is the interval over which the dedup hit ratio
	// (DedupHitRatio) is computed and DupRateWarn checked. Default
	// StatsInterval when that is positive, else DefaultStatsInterval.
	RateInterval time.Duration
	// NoDuplicateRecord turns off the record of absorbed duplicates
	// (inbox_duplicates) and the per-minute receive counts that Receive
	// writes in its statement. Default false: recorded.
	NoDuplicateRecord bool
	// ObserveReceive, when set, is called with the duration of every
	// pgrelay.Receive statement (the dedup check and insert of one batch).
	ObserveReceive func(time.Duration)
	// Targets are the handlers each received message is stored for: one
	// inbox row per handler, all in the batch's one Receive statement, each
	// deduplicated by its own key strategy. Default: Inbox.HandlerName keyed
	// by event id. Unless DisableWorkers is set, Inbox.HandlerName must be
	// among them.
	Targets []pgrelay.Target
	// ObserveConflicts, when set, is called with the number of key conflicts
	// (same dedup key, different payload fingerprint) each stored batch had,
	// per handler.
	ObserveConflicts func(handler string, n int)
	// Inbox configures the inbox workers that run the handler in the same
	// process. Its Handler is required; its Pool and Logger default to this
	// Config's.
	Inbox pgrelay.InboxConfig
	// DisableWorkers runs only the ingest side (broker into the inbox),
	// for deployments that run the inbox workers, and with them the inbox's
	// upkeep (pgrelay.InboxConfig.Retention), elsewhere. Default false.
	DisableWorkers bool
	// Direct runs the consumer without a subscriber, for a relay that stores
	// events straight into this database's inbox (broker/postgres): Run
	// calls Register, then runs the inbox workers only, woken by the relay's
	// NOTIFY. Subscribe must be nil. Default false.
	Direct bool
	// Register, with Direct, records Targets for DirectTopics in
	// pgrelay.inbox_subscriptions, for the relay that stores into this
	// inbox (the consumer package passes broker/postgres's Register); Run
	// retries it while the database is down. Default: none.
	Register func(ctx context.Context) error
	// DirectTopics are the topics a Direct consumer's targets take. Default
	// (nil): every topic.
	DirectTopics []string
	// NoApplyOnReceive turns off applying on receive: by default every
	// fetched batch of first deliveries has its events stored and their
	// handler run in one transaction (pgrelay.InboxWorker.ReceiveApply), and only
	// what fails there is left to the workers. With this set the workers
	// take every event. Default false.
	NoApplyOnReceive bool
	// AsyncCommit commits each batch's store transaction with
	// synchronous_commit off (for that transaction only), so that the commit
	// does not wait for the WAL flush and the next fetch starts at once; the
	// batch's deliveries are acknowledged only once the server has flushed
	// its WAL past the commit (docs/consumer.md, "Asynchronous commit"). The
	// acker reading the flush position holds one more connection, opened
	// with Pool's settings; it needs the server itself, not a connection
	// pooler. Default false.
	AsyncCommit bool
	// AsyncFlushAfter is how long, with AsyncCommit, an acknowledgement
	// waits for the WAL to be flushed by the server (its WAL writer, another
	// commit) before the acker forces the flush with a synchronous
	// transaction of its own. Default 5ms.
	AsyncFlushAfter time.Duration
	// AsyncPollInterval is how often, with AsyncCommit, the acker reads the
	// server's flushed WAL position while acknowledgements wait. Default
	// 1ms.
	AsyncPollInterval time.Duration
	// AsyncMaxPending is how many stored batches, with AsyncCommit, may wait
	// for their flush at once; one more waits to be handed over, holding
	// up its ingest loop. Together with IngestLoops and BatchSize it bounds
	// the deliveries left unacknowledged: keep (AsyncMaxPending+IngestLoops
	// +1)×BatchSize within the broker's limit (NATS MaxAckPending, default
	// 1000), or fetches come back short until acknowledgements are sent.
	// Default 4.
	AsyncMaxPending int
	// Logger receives the consumer's logs. Default: a no-op logger.
	Logger *slog.Logger
}

// Defaults for Config.
const (
	DefaultBatchSize = 100
	DefaultMaxWait   = 500 * time.Millisecond
	// DefaultIngestLoops is Config.IngestLoops' default: one batch at a
	// time. More loops did not measurably help on the two-core benchmark
	// machine, where smaller, more numerous commits cost the CPU they saved
	// in waiting (docs/benchmarks.md).
	DefaultIngestLoops   = 1
	DefaultStatsInterval = 30 * time.Second
	// Defaults of the AsyncCommit settings.
	DefaultAsyncFlushAfter   = 5 * time.Millisecond
	DefaultAsyncPollInterval = time.Millisecond
	DefaultAsyncMaxPending   = 4
	// DefaultMaxPayloadBytes is the largest payload a subscriber accepts
	// unless told otherwise; a larger message is stored dead.
	DefaultMaxPayloadBytes = 1 << 20
)

// WithDefaults returns a copy of c with every unset optional field set to its
// default.
func (c Config) WithDefaults() Config {
	if c.Inbox.HandlerName == "" {
		c.Inbox.HandlerName = pgrelay.DefaultHandlerName
	}
	if len(c.Targets) == 0 {
		c.Targets = []pgrelay.Target{{Handler: c.Inbox.HandlerName}}
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.MaxWait == 0 {
		c.MaxWait = DefaultMaxWait
	}
	if c.StoreTimeout == 0 {
		c.StoreTimeout = 15 * time.Second
	}
	if c.IngestLoops == 0 {
		c.IngestLoops = DefaultIngestLoops
	}
	if c.RetryMin == 0 {
		c.RetryMin = 100 * time.Millisecond
	}
	if c.RetryMax == 0 {
		c.RetryMax = 5 * time.Second
	}
	if c.StatsInterval == 0 {
		c.StatsInterval = DefaultStatsInterval
	}
	if c.RateInterval == 0 {
		c.RateInterval = c.StatsInterval
		if c.RateInterval <= 0 {
			c.RateInterval = DefaultStatsInterval
		}
	}
	if c.AsyncFlushAfter == 0 {
		c.AsyncFlushAfter = DefaultAsyncFlushAfter
	}
	if c.AsyncPollInterval == 0 {
		c.AsyncPollInterval = DefaultAsyncPollInterval
	}
	if c.AsyncMaxPending == 0 {
		c.AsyncMaxPending = DefaultAsyncMaxPending
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Inbox.Pool == nil {
		c.Inbox.Pool = c.Pool
	}
	if c.Inbox.Logger == nil {
		c.Inbox.Logger = c.Logger // the worker names its own logger "inbox"
	}
	return c
}

func (c Config) validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, setting.Errorf("", "Config", field, format, args...))
	}
	if c.Pool == nil {
		bad("Pool", "{} is required")
	}
	switch {
	case c.Direct && c.Subscribe != nil:
		bad("Subscribe", "{} must be nil with {Direct}: the relay stores into the inbox itself")
	case c.Direct && c.DisableWorkers:
		bad("Direct", "{} with {DisableWorkers} would run nothing: a direct consumer runs the inbox workers only")
	case !c.Direct && c.Subscribe == nil:
		bad("Subscribe", "{} is required (or set {Direct})")
	case !c.Direct && c.DirectTopics != nil:
		bad("DirectTopics", "{} is set without {Direct}")
	}
	if !(c.DupRateWarn >= 0 && c.DupRateWarn <= 1) { // NaN fails too
		bad("DupRateWarn", "{} %g must be between 0 and 1 (0 disables)", c.DupRateWarn)
	}
	if c.RateInterval < 0 {
		bad("RateInterval", "{} %s must be positive", c.RateInterval)
	}
	if c.BatchSize < 1 || c.BatchSize > 10000 {
		bad("BatchSize", "{} %d must be between 1 and 10000", c.BatchSize)
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
	if c.AsyncPollInterval < 100*time.Microsecond {
		bad("AsyncPollInterval", "{} %s must be at least 100µs", c.AsyncPollInterval)
	}
	if c.AsyncMaxPending < 1 {
		bad("AsyncMaxPending", "{} %d must be positive", c.AsyncMaxPending)
	}
	if c.StoreTimeout <= 0 {
		bad("StoreTimeout", "{} %s must be positive", c.StoreTimeout)
	}
	if c.RetryMin <= 0 || c.RetryMax < c.RetryMin {
		bad("RetryMin", "{} %s and {RetryMax} %s must be positive with RetryMin <= RetryMax", c.RetryMin, c.RetryMax)
	}
	if err := pgrelay.ValidateHandlerName(c.Inbox.HandlerName); err != nil {
		// Reported by the inbox worker's own validation (Config.Inbox.HandlerName).
		if c.DisableWorkers {
			bad("Inbox.HandlerName", "{}: %v", err)
		}
	} else if err := pgrelay.ValidateTargets(c.Targets); err != nil {
		bad("Targets", "{}: %v", err)
	} else if !c.DisableWorkers && !slices.ContainsFunc(c.Targets, func(t pgrelay.Target) bool {
		return t.Handler == c.Inbox.HandlerName || (t.Handler == "" && c.Inbox.HandlerName == pgrelay.DefaultHandlerName)
	}) {
		bad("Targets", "{} does not store rows for the handler the workers run ({Inbox.HandlerName} %q)", c.Inbox.HandlerName)
	}
	if !c.DisableWorkers && c.Inbox.Handler == nil {
		bad("Inbox.Handler", "{} is required (or set {DisableWorkers})")
	}
	return errors.Join(errs...)
}
