package consumer

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/pgrelay/pgrelay/internal/inbox"
	"github.com/pgrelay/pgrelay/internal/retention"
)

// Config configures a Consumer. The zero value of every optional field means
// its documented default; WithDefaults fills them in.
type Config struct {
	// Pool is the PostgreSQL pool holding the inbox. Required.
	Pool *pgxpool.Pool
	// NATSURL is the NATS server to consume from, for example
	// "nats://127.0.0.1:4222". Several URLs may be separated by commas.
	// Required.
	NATSURL string
	// Stream is the JetStream stream to consume. Default "PGRELAY".
	Stream string
	// SubjectPrefix is the prefix the relay puts before each topic; the
	// consumer strips it to recover the topic of a message that carries no
	// topic header. Default "pgrelay".
	SubjectPrefix string
	// CreateStream makes the consumer create Stream (subjects
	// "<SubjectPrefix>.>", file storage) when it does not exist yet, instead
	// of waiting for the relay to create it. Default false.
	CreateStream bool
	// Durable is the durable pull consumer's name: consumers sharing it share
	// the work. Default "pgrelay-consumer". When it does not exist it is
	// created delivering from now minus DedupWindow, never from the start of
	// the stream: older messages could be events whose inbox rows retention
	// already deleted.
	Durable string
	// DedupWindow is how long processed inbox rows are kept (inbox retention's
	// window): a redelivery of an event is recognised as a duplicate only
	// within it. At attach the stream's MaxAge and duplicate window are
	// checked against it. Default retention.DefaultWindow (7 days).
	DedupWindow time.Duration
	// AllowReplayBeyondDedupWindow lets the consumer run on a stream that
	// keeps messages longer than DedupWindow (or without an age limit), where
	// a replay of the stream could deliver events whose inbox rows retention
	// already deleted, and apply them again. Default false: such a stream is
	// refused at attach.
	AllowReplayBeyondDedupWindow bool
	// FilterSubject selects which subjects of the stream to consume. Default
	// "<SubjectPrefix>.>" (everything the relay publishes).
	FilterSubject string
	// BatchSize is how many messages one fetch asks for; each fetched batch is
	// stored in one transaction. Default 100.
	BatchSize int
	// MaxWait is how long an idle fetch waits for a first message (a fetch
	// takes what is available at once, up to BatchSize, without waiting for a
	// full batch). It also bounds how long shutdown waits for the fetch in
	// flight. Default 500ms.
	MaxWait time.Duration
	// AckWait is how long JetStream waits for an acknowledgement before it
	// redelivers a message. Default 30s.
	AckWait time.Duration
	// MaxAckPending caps the unacknowledged messages JetStream hands out to
	// this durable consumer. Default 10 × BatchSize.
	MaxAckPending int
	// MaxPayloadBytes is the largest accepted payload; a larger message is
	// stored dead with its reason. Default 1 MiB.
	MaxPayloadBytes int
	// StoreTimeout bounds one batch's inbox transaction. Default 15s.
	StoreTimeout time.Duration
	// RetryMin and RetryMax bound the exponential backoff (with jitter) after
	// a failed fetch, store or connect. Defaults 100ms and 5s.
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
	// ObserveReceive, when set, is called with the duration of every
	// inbox.Receive statement (the dedup check and insert of one batch).
	ObserveReceive func(time.Duration)
	// KeyStrategy builds the dedup key of the rows stored for the handler the
	// workers run (Inbox.HandlerName) when Targets is empty. Default: the
	// message-id strategy.
	KeyStrategy inbox.KeyStrategy
	// KeyStrategyByTopic overrides KeyStrategy for the messages of the named
	// topics (for the default target). Default: none.
	KeyStrategyByTopic map[string]inbox.KeyStrategy
	// Targets are the handlers each received message is stored for: one
	// inbox row per handler, all in the batch's one Receive statement, each
	// deduplicated by its own key strategy. Default: Inbox.HandlerName with
	// KeyStrategy. Unless DisableWorkers is set, Inbox.HandlerName must be
	// among them.
	Targets []inbox.Target
	// ObserveConflicts, when set, is called with the number of key conflicts
	// (same dedup key, different payload fingerprint) each stored batch had,
	// per handler.
	ObserveConflicts func(handler string, n int)
	// Inbox configures the inbox workers that run the handler in the same
	// process. Its Handler is required; its Pool and Logger default to this
	// Config's.
	Inbox inbox.Config
	// DisableWorkers runs only the ingest side (JetStream into the inbox),
	// for deployments that run the inbox workers elsewhere. Default false.
	DisableWorkers bool
	// Logger receives the consumer's logs. Default: a no-op logger.
	Logger *zap.Logger
}

// Defaults for Config.
const (
	DefaultStream          = "PGRELAY"
	DefaultSubjectPrefix   = "pgrelay"
	DefaultDurable         = "pgrelay-consumer"
	DefaultBatchSize       = 100
	DefaultMaxWait         = 500 * time.Millisecond
	DefaultAckWait         = 30 * time.Second
	DefaultMaxPayloadBytes = 1 << 20
	DefaultStatsInterval   = 30 * time.Second
)

// WithDefaults returns a copy of c with every unset optional field set to its
// default.
func (c Config) WithDefaults() Config {
	if c.Stream == "" {
		c.Stream = DefaultStream
	}
	if c.SubjectPrefix == "" {
		c.SubjectPrefix = DefaultSubjectPrefix
	}
	if c.Inbox.HandlerName == "" {
		c.Inbox.HandlerName = inbox.DefaultHandlerName
	}
	if c.Durable == "" {
		// A named handler gets its own durable: each handler receives every
		// message, whatever other handlers' consumers acknowledge.
		c.Durable = DefaultDurable
		if c.Inbox.HandlerName != inbox.DefaultHandlerName && inbox.ValidateHandlerName(c.Inbox.HandlerName) == nil {
			c.Durable = DefaultDurable + "-" + strings.ReplaceAll(c.Inbox.HandlerName, ".", "_")
		}
	}
	if len(c.Targets) == 0 {
		c.Targets = []inbox.Target{{Handler: c.Inbox.HandlerName, Strategy: c.KeyStrategy, ByTopic: c.KeyStrategyByTopic}}
	}
	if c.FilterSubject == "" {
		c.FilterSubject = c.SubjectPrefix + ".>"
	}
	if c.DedupWindow == 0 {
		c.DedupWindow = retention.DefaultWindow
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.MaxWait == 0 {
		c.MaxWait = DefaultMaxWait
	}
	if c.AckWait == 0 {
		c.AckWait = DefaultAckWait
	}
	if c.MaxAckPending == 0 {
		c.MaxAckPending = 10 * c.BatchSize
	}
	if c.MaxPayloadBytes == 0 {
		c.MaxPayloadBytes = DefaultMaxPayloadBytes
	}
	if c.StoreTimeout == 0 {
		c.StoreTimeout = 15 * time.Second
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
	if c.Logger == nil {
		c.Logger = zap.NewNop()
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
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.Pool == nil {
		bad("Config.Pool is required")
	}
	if strings.TrimSpace(c.NATSURL) == "" {
		bad("Config.NATSURL is required")
	}
	if strings.ContainsAny(c.Stream, " \t\r\n.*>") {
		bad("Config.Stream %q must not contain spaces, '.', '*' or '>'", c.Stream)
	}
	if strings.ContainsAny(c.Durable, " \t\r\n.*>") {
		bad("Config.Durable %q must not contain spaces, '.', '*' or '>'", c.Durable)
	}
	if strings.ContainsAny(c.SubjectPrefix, " \t\r\n*>") || strings.HasSuffix(c.SubjectPrefix, ".") {
		bad("Config.SubjectPrefix %q is not a subject prefix", c.SubjectPrefix)
	}
	if !(c.DupRateWarn >= 0 && c.DupRateWarn <= 1) { // NaN fails too
		bad("Config.DupRateWarn %g must be between 0 and 1 (0 disables)", c.DupRateWarn)
	}
	if c.RateInterval < 0 {
		bad("Config.RateInterval %s must be positive", c.RateInterval)
	}
	if c.DedupWindow < 0 {
		bad("Config.DedupWindow %s must be positive", c.DedupWindow)
	}
	if c.BatchSize < 1 || c.BatchSize > 10000 {
		bad("Config.BatchSize %d must be between 1 and 10000", c.BatchSize)
	}
	if c.MaxWait < 10*time.Millisecond {
		bad("Config.MaxWait %s must be at least 10ms", c.MaxWait)
	}
	if c.AckWait < time.Second {
		bad("Config.AckWait %s must be at least 1s", c.AckWait)
	}
	if c.BatchSize >= 1 && c.MaxAckPending < c.BatchSize { // derived from BatchSize: only once that is valid
		bad("Config.MaxAckPending %d must be at least Config.BatchSize %d", c.MaxAckPending, c.BatchSize)
	}
	if c.MaxPayloadBytes < 0 {
		bad("Config.MaxPayloadBytes %d must not be negative", c.MaxPayloadBytes)
	}
	if c.StoreTimeout <= 0 {
		bad("Config.StoreTimeout %s must be positive", c.StoreTimeout)
	}
	if c.RetryMin <= 0 || c.RetryMax < c.RetryMin {
		bad("Config.RetryMin %s and Config.RetryMax %s must be positive with RetryMin <= RetryMax", c.RetryMin, c.RetryMax)
	}
	if err := inbox.ValidateHandlerName(c.Inbox.HandlerName); err != nil {
		// Reported by the inbox worker's own validation (Config.Inbox.HandlerName).
		if c.DisableWorkers {
			bad("Config.Inbox.HandlerName: %v", err)
		}
	} else if err := inbox.ValidateTargets(c.Targets); err != nil {
		bad("Config.Targets: %v", err)
	} else if !c.DisableWorkers && !slices.ContainsFunc(c.Targets, func(t inbox.Target) bool {
		return t.Handler == c.Inbox.HandlerName || (t.Handler == "" && c.Inbox.HandlerName == inbox.DefaultHandlerName)
	}) {
		bad("Config.Targets does not store rows for the handler the workers run (Config.Inbox.HandlerName %q)", c.Inbox.HandlerName)
	}
	if !c.DisableWorkers && c.Inbox.Handler == nil {
		bad("Config.Inbox.Handler is required (or set Config.DisableWorkers)")
	}
	return errors.Join(errs...)
}
