// Package consumer runs pgrelay's consumer as a library: it fetches
// deliveries from a broker subscriber (NATS JetStream, Kafka, RabbitMQ, or
// any broker.Subscriber), stores them in the inbox, deduplicated, and runs a
// pgrelay.InboxHandler over them exactly once per event, together with the
// inbox's retention. Prometheus metrics, health checks and the admin API are
// opt-in (Config.MetricsAddr, Config.AdminAddr).
//
// A program that only enqueues or only runs an inbox worker needs the root
// package alone; this package adds the broker seam, metrics and the
// operator endpoints.
package consumer

import (
	"context"
	"errors"
	"fmt"
	"go.uber.org/zap"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/broker"
	engine "github.com/pgrelay/pgrelay/internal/consumer"
	"github.com/pgrelay/pgrelay/internal/endpoints"
	"github.com/pgrelay/pgrelay/internal/inbox"
	"github.com/pgrelay/pgrelay/internal/inboxadapt"
	"github.com/pgrelay/pgrelay/internal/logbridge"
	"github.com/pgrelay/pgrelay/internal/metrics"
	"github.com/pgrelay/pgrelay/internal/setting"
	"github.com/pgrelay/pgrelay/migrations"
)

// Defaults for Config.
const (
	DefaultStream          = broker.DefaultStream
	DefaultSubjectPrefix   = broker.DefaultSubjectPrefix
	DefaultDurable         = broker.DefaultDurable
	DefaultFetchBatchSize  = engine.DefaultBatchSize
	DefaultMaxWait         = engine.DefaultMaxWait
	DefaultAckWait         = broker.DefaultAckWait
	DefaultMaxPayloadBytes = engine.DefaultMaxPayloadBytes
	DefaultStatsInterval   = engine.DefaultStatsInterval
	DefaultDedupWindow     = inbox.DefaultDedupWindow
	DefaultWorkers         = inbox.DefaultWorkers
	DefaultWorkerBatchSize = inbox.DefaultBatchSize
	DefaultMaxAttempts     = inbox.DefaultMaxAttempts
	DefaultLease           = inbox.DefaultLease
	DefaultHandlerTimeout  = inbox.DefaultHandlerTimeout
	DefaultStartupTimeout  = 30 * time.Second
)

// Subscriber is where a Consumer fetches deliveries from: a durable
// JetStream consumer, a Kafka consumer group, a RabbitMQ queue. Deliveries
// not acknowledged are redelivered by the broker.
type Subscriber = broker.Subscriber

// Delivery is one message a Subscriber fetched, decoded, with the functions
// that acknowledge it (after its inbox transaction committed) and postpone
// its redelivery.
type Delivery = broker.Delivery

// Config configures a Consumer. The zero value of every optional field
// means the default it documents; WithDefaults fills them in.
type Config struct {
	// Pool is the PostgreSQL database holding the inbox (migrated with
	// `relay migrate up` or the migrations package). Required. Give it at
	// least Workers+4 connections.
	Pool *pgxpool.Pool
	// NATSURL is the NATS server (or comma-separated servers) to consume
	// from, for example "nats://127.0.0.1:4222". Required unless Subscribe
	// is set.
	NATSURL string
	// Subscribe, when set, creates the subscriber the consumer fetches from
	// instead of NATS JetStream (NATSURL and the JetStream settings Stream,
	// SubjectPrefix, CreateStream, Durable, FilterSubject, AllowReplay...,
	// AckWait and MaxPayloadBytes are then unused: the subscriber has its
	// own). Run calls it once and closes the subscriber when it returns.
	// Default nil: NATS JetStream.
	Subscribe func(ctx context.Context) (Subscriber, error)
	// Handler applies each event, in the transaction that marks it processed.
	// An InboxBatchHandler also applies whole batches. Required.
	Handler pgrelay.InboxHandler
	// HandlerName names Handler: its inbox rows, attempts, leases and dead
	// letters are its own, so several handlers in one database each process
	// an event once. It labels the worker metrics (handler) and, unless
	// Durable is set, names the durable consumer
	// (pgrelay-consumer-<name>), so that each handler receives every
	// message. Default DefaultHandlerName ("default").
	HandlerName string
	// DedupKey is Handler's key strategy spec (ParseKeyStrategy): how the
	// dedup key of its rows is built. A bad spec fails New naming
	// this field. Default "message-id".
	DedupKey string
	// DedupKeyByTopic overrides DedupKey for the messages of the named
	// topics: topic → key strategy spec. Default: none.
	DedupKeyByTopic map[string]string
	// Targets, when set, are the handlers each received message is stored
	// for (one row each, in one statement), for a consumer whose ingest feeds
	// several handlers; HandlerName must be among them. Default: HandlerName
	// with DedupKey.
	Targets []pgrelay.Target

	// Stream is the JetStream stream to consume. Default DefaultStream.
	Stream string
	// SubjectPrefix is the prefix the relay puts before each topic. Default
	// DefaultSubjectPrefix.
	SubjectPrefix string
	// CreateStream creates Stream when it does not exist instead of waiting
	// for the relay to create it. Default false.
	CreateStream bool
	// Durable is the durable consumer's name; consumers sharing it share the
	// work. Default DefaultDurable.
	Durable string
	// FilterSubject selects the subjects to consume. Default
	// "<SubjectPrefix>.>".
	FilterSubject string
	// DedupWindow is how long processed inbox rows are kept to absorb
	// redeliveries; retention deletes them after it. A stream keeping
	// messages longer is refused at start-up. Default DefaultDedupWindow.
	DedupWindow time.Duration
	// AllowReplayBeyondDedupWindow runs on a stream that keeps messages
	// longer than DedupWindow, where a replay could apply an event twice.
	// Default false.
	AllowReplayBeyondDedupWindow bool
	// DedupRecordMax is how many recorded duplicates (inbox_duplicates, the
	// operator console's feed) retention keeps. Default 10000.
	DedupRecordMax int
	// FetchBatchSize is how many messages one fetch asks for, stored in one
	// transaction. Default DefaultFetchBatchSize.
	FetchBatchSize int
	// MaxWait is how long an idle fetch waits; it also bounds shutdown.
	// Default DefaultMaxWait.
	MaxWait time.Duration
	// AckWait is when JetStream redelivers an unacknowledged message.
	// Default DefaultAckWait.
	AckWait time.Duration
	// MaxPayloadBytes is the largest accepted payload; a larger message is
	// stored dead. Default DefaultMaxPayloadBytes.
	MaxPayloadBytes int
	// StatsInterval is how often the ingest counters are logged; negative
	// disables. Default DefaultStatsInterval.
	StatsInterval time.Duration
	// DupRateWarn is the share of deliveries absorbed as duplicates (0..1)
	// over one stats interval above which "high duplicate rate" is logged at
	// warn. Default 0: no warning.
	DupRateWarn float64

	// NoApplyOnReceive turns off applying on receive. By default, while the
	// inbox workers are idle and the consumer keeps up with the broker (a
	// fetch returns less than a full batch), the events of a fetched batch
	// are stored and their handler run in one transaction, so that an event
	// is not claimed a second time; whatever fails there (an error, a
	// deferral, a panic) is rolled back and left to the workers, uncounted
	// as an attempt. Under a backlog the workers take every event. Default
	// false.
	NoApplyOnReceive bool

	// Workers is how many inbox batches run concurrently. Default
	// DefaultWorkers.
	Workers int
	// WorkerBatchSize is the most events per inbox transaction. Default
	// DefaultWorkerBatchSize.
	WorkerBatchSize int
	// MaxAttempts is the handler attempts before an event goes dead. Default
	// DefaultMaxAttempts.
	MaxAttempts int
	// Lease is how long a claim is exclusive. Default DefaultLease.
	Lease time.Duration
	// HandlerTimeout bounds one handler call; shorter than Lease. Default
	// DefaultHandlerTimeout.
	HandlerTimeout time.Duration
	// BackoffMin and BackoffMax bound the retry backoff of a failed handler.
	// Defaults 1s and 5m.
	BackoffMin, BackoffMax time.Duration
	// PollInterval is the fallback poll for due events. Default 1s.
	PollInterval time.Duration
	// Ordered applies the events of one key strictly in their per-key
	// sequence (Pgrelay-Key-Seq): a key's later event waits while an earlier
	// one is missing, retrying or dead; a duplicate sequence is absorbed.
	// Events without a sequence are applied unordered. Default false. See
	// README "Ordered apply".
	Ordered bool
	// GapTimeout is how long an ordered key may wait for a missing sequence
	// before the gap is reported. Default 5m.
	GapTimeout time.Duration

	// MetricsAddr serves /metrics, /healthz and /readyz, for example ":9091".
	// Default "": not served.
	MetricsAddr string
	// AdminAddr serves the admin API (stats, dead letters, replay), for
	// example "127.0.0.1:9191". Default "": not served.
	AdminAddr string
	// AdminToken is the bearer token the admin API requires; required when
	// AdminAddr is not a loopback address. Default "".
	AdminToken string
	// StartupTimeout bounds the database check at start-up. Default
	// DefaultStartupTimeout.
	StartupTimeout time.Duration
	// Logger receives the logs. Default: a no-op logger.
	Logger *slog.Logger

	zlog *zap.Logger // Logger, for the engine
}

// WithDefaults returns a copy of c with every unset optional field set to its
// default.
func (c Config) WithDefaults() Config {
	set := func(p *string, v string) {
		if *p == "" {
			*p = v
		}
	}
	set(&c.HandlerName, pgrelay.DefaultHandlerName)
	if c.Durable == "" && c.HandlerName != pgrelay.DefaultHandlerName && inbox.ValidateHandlerName(c.HandlerName) == nil {
		c.Durable = DefaultDurable + "-" + strings.ReplaceAll(c.HandlerName, ".", "_")
	}
	set(&c.Stream, DefaultStream)
	set(&c.SubjectPrefix, DefaultSubjectPrefix)
	set(&c.Durable, DefaultDurable)
	set(&c.FilterSubject, c.SubjectPrefix+".>")
	setZero(&c.DedupWindow, DefaultDedupWindow)
	setZero(&c.FetchBatchSize, DefaultFetchBatchSize)
	setZero(&c.MaxWait, DefaultMaxWait)
	setZero(&c.AckWait, DefaultAckWait)
	setZero(&c.MaxPayloadBytes, DefaultMaxPayloadBytes)
	setZero(&c.StatsInterval, DefaultStatsInterval)
	setZero(&c.Workers, DefaultWorkers)
	setZero(&c.WorkerBatchSize, DefaultWorkerBatchSize)
	setZero(&c.MaxAttempts, DefaultMaxAttempts)
	setZero(&c.Lease, DefaultLease)
	setZero(&c.HandlerTimeout, DefaultHandlerTimeout)
	setZero(&c.BackoffMin, inbox.DefaultBackoffMin)
	setZero(&c.BackoffMax, inbox.DefaultBackoffMax)
	setZero(&c.PollInterval, inbox.DefaultPollInterval)
	setZero(&c.StartupTimeout, DefaultStartupTimeout)
	c.zlog = logbridge.Zap(c.Logger)
	return c
}

func setZero[T int | time.Duration](p *T, def T) {
	if *p == 0 {
		*p = def
	}
}

// publicField names the Config field that sets a field of the
// internal services' configs (structName: engine.Config,
// broker.NATSSubscriberConfig).
func publicField(structName, field string) string {
	switch structName {
	case "NATSSubscriberConfig":
		switch field {
		case "URL":
			return "NATSURL"
		case "MaxAckPending":
			return "10 × {FetchBatchSize}"
		}
	case "Config":
		switch {
		case field == "BatchSize":
			return "FetchBatchSize"
		case field == "Inbox.BatchSize":
			return "WorkerBatchSize"
		case field == "Inbox.Retention.Window":
			return "DedupWindow"
		case field == "Inbox.Retention.DuplicatesMax":
			return "DedupRecordMax"
		case strings.HasPrefix(field, "Inbox."):
			return strings.TrimPrefix(field, "Inbox.")
		}
	}
	return field
}

// publicError renames the internal services' fields in err's
// *setting.FieldErrors to the Config fields that set them.
func publicError(err error) error {
	return setting.Map(err, func(fe *setting.FieldError) error {
		if fe.Struct == "consumer.Config" {
			return fe
		}
		return fe.Renamed("consumer.Config", func(f string) string { return publicField(fe.Struct, f) })
	})
}

// configError is a *setting.FieldError of a Config field.
func configError(field, format string, args ...any) error {
	return setting.Errorf("", "consumer.Config", field, format, args...)
}

// Consumer receives events from a broker (NATS JetStream by default, or the
// Subscriber Config.Subscribe creates) into the inbox, deduplicated by
// event id, and runs the handler over them exactly once per event, together
// with inbox retention, Prometheus metrics, health checks and the admin API.
// Create it with New and run it with Run.
type Consumer struct {
	cfg     Config
	c       *engine.Consumer
	reg     *prometheus.Registry
	running atomic.Bool
	started chan struct{}
	ops     *endpoints.Running
}

// New checks cfg (after WithDefaults) and builds a consumer; it does
// not connect to anything until Run. An invalid setting is reported naming its
// Config field.
func New(cfg Config) (*Consumer, error) {
	cfg = cfg.WithDefaults()
	var errs []error
	if cfg.StartupTimeout < 0 {
		errs = append(errs, configError("StartupTimeout", "{} %s must be positive", cfg.StartupTimeout))
	}
	if err := checkAddr("MetricsAddr", cfg.MetricsAddr); err != nil {
		errs = append(errs, err)
	}
	if err := checkAddr("AdminAddr", cfg.AdminAddr); err != nil {
		errs = append(errs, err)
	}
	strategy, err := inbox.ParseKeyStrategy(cfg.DedupKey)
	if err != nil {
		errs = append(errs, configError("DedupKey", "{}: %w", err))
	}
	byTopic, topicErrs := parseByTopic("DedupKeyByTopic", cfg.DedupKeyByTopic)
	errs = append(errs, topicErrs...)
	var targets []inbox.Target
	var names []string
	for i, t := range cfg.Targets {
		s, err := inbox.ParseKeyStrategy(t.DedupKey)
		if err != nil {
			errs = append(errs, configError(fmt.Sprintf("Targets[%d].DedupKey", i), "{}: %w", err))
		}
		bt, terrs := parseByTopic(fmt.Sprintf("Targets[%d].DedupKeyByTopic", i), t.DedupKeyByTopic)
		errs = append(errs, terrs...)
		targets = append(targets, inbox.Target{Handler: t.Handler, Strategy: s, ByTopic: bt})
		names = append(names, t.Handler)
	}
	pc := &Consumer{cfg: cfg, reg: metrics.NewRegistry(), started: make(chan struct{})}
	observer := metrics.NewInboxObserver(pc.reg, metrics.InboxObserverOptions{
		Handler:  cfg.HandlerName,
		Handlers: names,
		IngestStats: func() metrics.IngestStats {
			st := pc.c.Stats()
			return metrics.IngestStats{Received: st.Fetched, Duplicates: st.Duplicates, Dead: st.Dead,
				StoreErrors: st.StoreErrors, FetchErrors: st.FetchErrors, AppliedOnReceive: st.AppliedOnReceive,
				HitRatio: pc.c.DedupHitRatio()}
		},
	})
	subscribe := cfg.Subscribe
	if subscribe == nil {
		nc := cfg.natsSubscriber()
		if err := nc.Validate(); err != nil {
			errs = append(errs, publicError(err))
		}
		subscribe = broker.SubscribeNATS(nc)
	}
	c, err := engine.New(engine.Config{
		Pool:               cfg.Pool,
		Subscribe:          subscribe,
		BatchSize:          cfg.FetchBatchSize,
		MaxWait:            cfg.MaxWait,
		StatsInterval:      cfg.StatsInterval,
		DupRateWarn:        cfg.DupRateWarn,
		ObserveReceive:     observer.ObserveReceive,
		ObserveConflicts:   observer.KeyConflicts,
		KeyStrategy:        strategy,
		KeyStrategyByTopic: byTopic,
		Targets:            targets,
		NoApplyOnReceive:   cfg.NoApplyOnReceive,
		Inbox: inbox.Config{
			Handler:        inboxadapt.NewHandler[pgrelay.InboxEvent](cfg.Handler, fromInboxEvent),
			HandlerName:    cfg.HandlerName,
			Workers:        cfg.Workers,
			BatchSize:      cfg.WorkerBatchSize,
			MaxAttempts:    cfg.MaxAttempts,
			Lease:          cfg.Lease,
			HandlerTimeout: cfg.HandlerTimeout,
			BackoffMin:     cfg.BackoffMin,
			BackoffMax:     cfg.BackoffMax,
			PollInterval:   cfg.PollInterval,
			Observer:       observer,
			Retention: inbox.RetentionConfig{
				Window: cfg.DedupWindow, DuplicatesMax: cfg.DedupRecordMax,
				Observer: metrics.NewRetentionObserver(pc.reg), Logger: cfg.zlog,
			},
			Ordered:    cfg.Ordered,
			GapTimeout: cfg.GapTimeout,
		},
		Logger: cfg.zlog,
	})
	if err != nil {
		// engine.New prefixes "consumer: "; keep it once, before the list.
		if inner := errors.Unwrap(err); inner != nil && strings.HasPrefix(err.Error(), "consumer: ") {
			err = inner
		}
		errs = append([]error{publicError(err)}, errs...)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("consumer: %w", errors.Join(errs...))
	}
	pc.c = c
	return pc, nil
}

// parseByTopic parses per-topic key strategy specs; errors name field[topic].
func parseByTopic(field string, specs map[string]string) (map[string]inbox.KeyStrategy, []error) {
	if len(specs) == 0 {
		return nil, nil
	}
	out := make(map[string]inbox.KeyStrategy, len(specs))
	var errs []error
	for topic, spec := range specs {
		s, err := inbox.ParseKeyStrategy(spec)
		if err != nil {
			errs = append(errs, configError(field, "{}[%q]: %w", topic, err))
			continue
		}
		out[topic] = s
	}
	return out, errs
}

// natsSubscriber is the NATS subscriber's configuration (with its defaults)
// from cfg.
func (cfg Config) natsSubscriber() broker.NATSSubscriberConfig {
	nc := broker.NATSSubscriberConfig{
		URL: cfg.NATSURL, Stream: cfg.Stream, SubjectPrefix: cfg.SubjectPrefix, CreateStream: cfg.CreateStream,
		Durable: cfg.Durable, FilterSubject: cfg.FilterSubject, DedupWindow: cfg.DedupWindow,
		AllowReplayBeyondDedupWindow: cfg.AllowReplayBeyondDedupWindow, AckWait: cfg.AckWait,
		MaxPayloadBytes: cfg.MaxPayloadBytes, Logger: cfg.zlog,
	}
	if cfg.FetchBatchSize >= 1 { // derived from it: only once that is valid
		nc.MaxAckPending = 10 * cfg.FetchBatchSize
	}
	return nc.WithDefaults()
}

func checkAddr(field, addr string) error {
	if addr == "" {
		return nil
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return configError(field, "{} %q: %w", addr, err)
	}
	return nil
}

// Run checks the database (reachable and migrated), binds MetricsAddr and
// AdminAddr, then consumes until ctx is cancelled and shuts down gracefully:
// the batch in hand is stored and acknowledged, the handlers in flight
// finish. It returns nil after a graceful shutdown. Broker and database
// outages while running are retried, never returned; a setting that cannot
// work (an unreachable NATS server at start-up, a stream outliving
// DedupWindow, a busy address, a database without the migrations) is, naming
// its Config field.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("consumer: Run was already called; create another Consumer")
	}
	if err := c.checkDatabase(ctx); err != nil {
		return err
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	ops, err := endpoints.Start(ctx, endpoints.Config{
		Flags: endpoints.Flags{MetricsAddr: c.cfg.MetricsAddr, AdminAddr: c.cfg.AdminAddr,
			AdminToken: c.cfg.AdminToken},
		Pool: c.cfg.Pool, Registry: c.reg, Inbox: true, Logger: c.cfg.zlog,
		Checks: map[string]metrics.Check{
			"database": metrics.PingCheck(c.cfg.Pool),
			"broker": func(context.Context) error {
				if !c.c.Ready() {
					return errors.New("not fetching from the broker")
				}
				return nil
			},
		},
		Counters: func() (float64, float64, bool) {
			st := c.c.Stats()
			return float64(st.Fetched), float64(st.Duplicates), true
		},
	})
	if err != nil {
		return fmt.Errorf("consumer: %w", publicOpsError(err))
	}
	c.ops = ops
	close(c.started)
	runErr := publicError(c.c.Run(ctx))
	stop() // Run returned on its own: stop the operator endpoints too
	return errors.Join(runErr, ops.Wait())
}

// publicOpsError renames the operator settings, which the services name by
// their flags, to Config fields.
func publicOpsError(err error) error {
	return errors.New(strings.NewReplacer(
		"--metrics-addr (METRICS_ADDR)", "Config.MetricsAddr",
		"--admin-addr (ADMIN_ADDR)", "Config.AdminAddr",
		"--admin-token (ADMIN_TOKEN)", "Config.AdminToken",
	).Replace(err.Error()))
}

// checkDatabase fails start-up when the database cannot be reached or lacks
// the migrations: consuming into a partial schema would only loop on errors
// while looking alive.
func (c *Consumer) checkDatabase(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.StartupTimeout)
	defer cancel()
	if err := c.cfg.Pool.Ping(ctx); err != nil {
		return setting.Errorf("consumer", "consumer.Config", "Pool", "{}: cannot reach PostgreSQL: %w", err)
	}
	sqlDB := stdlib.OpenDBFromPool(c.cfg.Pool)
	defer sqlDB.Close()
	if err := migrations.Check(ctx, sqlDB); err != nil {
		return setting.Errorf("consumer", "consumer.Config", "Pool", "{}: %w; apply the migrations first", err)
	}
	return nil
}

// Ready reports whether the consumer is fetching: its last fetch from the
// broker succeeded.
func (c *Consumer) Ready() bool { return c.c.Ready() }

// Stats are a consumer's ingest counters since it started.
type Stats = engine.IngestCounts

// Stats returns a snapshot of the ingest counters.
func (c *Consumer) Stats() Stats { return c.c.Stats() }

// MetricsAddr returns the address the metrics server listens on once Run has
// started it (useful with port 0), or nil.
func (c *Consumer) MetricsAddr() net.Addr {
	select {
	case <-c.started:
		return c.ops.MetricsAddr()
	default:
		return nil
	}
}

// AdminAddr returns the address the admin API listens on once Run has started
// it, or nil.
func (c *Consumer) AdminAddr() net.Addr {
	select {
	case <-c.started:
		return c.ops.AdminAddr()
	default:
		return nil
	}
}

// fromInboxEvent converts a claimed engine event for a handler.
func fromInboxEvent(ev *inbox.Event) *pgrelay.InboxEvent {
	return &pgrelay.InboxEvent{Message: pgrelay.Message(ev.Message), Handler: ev.Handler, DedupKey: ev.DedupKey,
		ReceivedAt: ev.ReceivedAt, Attempts: ev.Attempts, Deferrals: ev.Deferrals,
		LockVersion: ev.LockVersion, LastError: ev.LastError}
}
