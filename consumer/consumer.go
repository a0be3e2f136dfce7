// Package consumer runs pgrelay's consumer as a library: it fetches
// deliveries from a broker subscriber (NATS JetStream, Kafka, RabbitMQ, or
// any broker.Subscriber; none with Config.Direct, when the relay stores into
// the inbox itself), stores them in the inbox, deduplicated, and runs a
// pgrelay.InboxHandler over them exactly once per event, together with the
// inbox's retention. Prometheus metrics, health checks and the admin API are
// opt-in (Config.MetricsAddr, Config.AdminAddr).
//
// The broker is chosen by Config.Subscribe, so a program carries only the
// client of the broker it uses:
//
//	c, err := consumer.New(consumer.Config{
//		Pool:      pool,
//		Subscribe: broker.Subscribe(nats.NewSubscriber, nats.Config{URL: "nats://127.0.0.1:4222"}),
//		Inbox:     pgrelay.InboxConfig{Handler: handler},
//	})
//
// A program that only enqueues, or runs an inbox worker fed by its own code,
// needs the root package alone.
package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/postgres"
	"github.com/pgrelay/pgrelay/internal/admin/adminhttp"
	"github.com/pgrelay/pgrelay/internal/console"
	engine "github.com/pgrelay/pgrelay/internal/consumer"
	"github.com/pgrelay/pgrelay/internal/endpoints"
	"github.com/pgrelay/pgrelay/internal/logbridge"
	"github.com/pgrelay/pgrelay/internal/metrics"
	"github.com/pgrelay/pgrelay/internal/pooler"
	"github.com/pgrelay/pgrelay/internal/setting"
)

// Defaults for Config.
const (
	DefaultFetchBatchSize = engine.DefaultBatchSize
	DefaultMaxWait        = engine.DefaultMaxWait
	DefaultIngestLoops    = engine.DefaultIngestLoops
	// DefaultAsyncFlushAfter is Config.AsyncFlushAfter's default.
	DefaultAsyncFlushAfter = engine.DefaultAsyncFlushAfter
	DefaultStatsInterval   = engine.DefaultStatsInterval
	DefaultStartupTimeout  = 30 * time.Second
	// DefaultMaxPayloadBytes is the payload limit a command-line consumer
	// gives its subscriber (the adapters' Config.MaxPayloadBytes).
	DefaultMaxPayloadBytes = engine.DefaultMaxPayloadBytes
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
	// broker/postgres): Run registers the handlers (Targets, or
	// Inbox.HandlerName with DedupKey) in pgrelay.inbox_subscriptions and
	// runs the inbox workers only, woken by the relay's NOTIFY. Subscribe
	// must then be nil. See docs/postgres-broker.md. Default false.
	Direct bool
	// DirectTopics, with Direct, are the topics the handlers take. Default
	// (nil): every topic.
	DirectTopics []string
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

	// MetricsAddr serves /metrics, /healthz and /readyz, for example ":9091".
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
}

// configError is a *setting.FieldError of a Config field.
func configError(field, format string, args ...any) error {
	return setting.Errorf("", "consumer.Config", field, format, args...)
}

// publicError names the engine's fields as the Config fields that set
// them: the engine's BatchSize is FetchBatchSize, its Inbox.* and
// Retention.* the same paths under Inbox.
func publicError(err error) error {
	return setting.Map(err, func(fe *setting.FieldError) error {
		if fe.Struct != "Config" { // not the engine's: a subscriber's, a publisher's, already ours
			return fe
		}
		return fe.Renamed("consumer.Config", func(f string) string {
			if f == "BatchSize" {
				return "FetchBatchSize"
			}
			return f
		})
	})
}

// Consumer receives events from a broker into the inbox, deduplicated, and
// runs the handler over them exactly once per event, together with inbox
// retention and, when configured, metrics, health checks and the admin API.
// Create it with New and run it with Run.
type Consumer struct {
	cfg     Config
	log     *slog.Logger
	c       *engine.Consumer
	reg     *prometheus.Registry
	running atomic.Bool
	started chan struct{}
	ops     *endpoints.Running
	// sub is the subscriber Run created, for the console's broker page.
	sub atomic.Pointer[broker.Subscriber]
}

// subscribe creates the subscriber with Config.Subscribe and keeps it.
func (c *Consumer) subscribe(ctx context.Context) (broker.Subscriber, error) {
	sub, err := c.cfg.Subscribe(ctx)
	if err == nil {
		c.sub.Store(&sub)
	}
	return sub, err
}

// retention reads the broker's retention for the web console, when the
// subscriber can (broker.RetentionReporter).
func (c *Consumer) retention(ctx context.Context) (*console.BrokerSettings, error) {
	p := c.sub.Load()
	if p == nil {
		return nil, errors.New("not connected to the broker yet")
	}
	rr, ok := (*p).(broker.RetentionReporter)
	if !ok {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	r, err := rr.Retention(ctx)
	if err != nil {
		return nil, err
	}
	return &console.BrokerSettings{Kind: r.Kind, Name: r.Name, MaxAge: r.MaxAge, DuplicateWindow: r.DuplicateWindow}, nil
}

// New checks cfg and builds a consumer; it does not connect to anything
// until Run. Every invalid setting is reported, each naming its Config field.
func New(cfg Config) (*Consumer, error) {
	if cfg.StartupTimeout == 0 {
		cfg.StartupTimeout = DefaultStartupTimeout
	}
	if cfg.Inbox.Pool == nil {
		cfg.Inbox.Pool = cfg.Pool
	}
	if cfg.Inbox.Logger == nil {
		cfg.Inbox.Logger = cfg.Logger
	}
	if cfg.Inbox.HandlerName == "" {
		cfg.Inbox.HandlerName = pgrelay.DefaultHandlerName
	}
	var errs []error
	if cfg.Subscribe == nil && !cfg.Direct {
		errs = append(errs, configError("Subscribe", "{} is required: broker.Subscribe(nats.NewSubscriber, nats.Config{...}) or another adapter's (or set {Direct})"))
	}
	if cfg.StartupTimeout < 0 {
		errs = append(errs, configError("StartupTimeout", "{} %s must be positive", cfg.StartupTimeout))
	}
	errs = append(errs, checkOps(cfg)...)
	targets := cfg.Targets
	field := "Targets"
	if len(targets) == 0 {
		targets = []pgrelay.Target{{Handler: cfg.Inbox.HandlerName, DedupKey: cfg.DedupKey, DedupKeyByTopic: cfg.DedupKeyByTopic}}
		field = ""
	}
	names, terrs := checkTargets(field, targets)
	errs = append(errs, terrs...)

	log := logbridge.Or(cfg.Logger)
	pc := &Consumer{cfg: cfg, log: log, reg: metrics.NewRegistry(), started: make(chan struct{})}
	observer := metrics.NewInboxObserver(pc.reg, metrics.InboxObserverOptions{
		Handler:  cfg.Inbox.HandlerName,
		Handlers: names,
		IngestStats: func() metrics.IngestStats {
			st := pc.c.Stats()
			return metrics.IngestStats{Received: st.Fetched, Duplicates: st.Duplicates, Dead: st.Dead,
				StoreErrors: st.StoreErrors, FetchErrors: st.FetchErrors, AppliedOnReceive: st.AppliedOnReceive,
				Unacked: st.Unacked, HitRatio: pc.c.DedupHitRatio()}
		},
	})
	inboxCfg := cfg.Inbox
	inboxCfg.Observer = teeObserver(observer, inboxCfg.Observer)
	if o := inboxCfg.Retention.Observer; o != nil {
		inboxCfg.Retention.Observer = retentionTee{metrics.NewRetentionObserver(pc.reg), o}
	} else {
		inboxCfg.Retention.Observer = metrics.NewRetentionObserver(pc.reg)
	}
	// The subscriber is kept for the web console's retention read; a
	// direct consumer (broker/postgres) has none.
	var subscribe func(context.Context) (broker.Subscriber, error)
	if cfg.Subscribe != nil {
		subscribe = pc.subscribe
	}
	c, err := engine.New(engine.Config{
		Pool:             cfg.Pool,
		Subscribe:        subscribe,
		Direct:           cfg.Direct,
		DirectTopics:     cfg.DirectTopics,
		Register:         register(cfg.Pool, targets, cfg.DirectTopics),
		BatchSize:        cfg.FetchBatchSize,
		MaxWait:          cfg.MaxWait,
		IngestLoops:      cfg.IngestLoops,
		StatsInterval:    cfg.StatsInterval,
		DupRateWarn:      cfg.DupRateWarn,
		ObserveReceive:   observer.ObserveReceive,
		ObserveConflicts: observer.KeyConflicts,
		Targets:          targets,
		NoApplyOnReceive: cfg.NoApplyOnReceive,
		AsyncCommit:      cfg.AsyncCommit,
		AsyncFlushAfter:  cfg.AsyncFlushAfter,
		Inbox:            inboxCfg,
		Logger:           log,
	})
	if err != nil {
		// The engine prefixes "consumer: "; keep it once, before the list.
		if inner := errors.Unwrap(err); inner != nil {
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

// checkTargets checks the targets' key strategy specs and returns their
// handler names; errors name field[i].DedupKey, or DedupKey and
// DedupKeyByTopic for the default target (field empty).
func checkTargets(field string, targets []pgrelay.Target) ([]string, []error) {
	names := make([]string, len(targets))
	var errs []error
	for i, t := range targets {
		prefix := ""
		if field != "" {
			prefix = fmt.Sprintf("%s[%d].", field, i)
		}
		names[i] = t.Handler
		if err := pgrelay.ValidateKeyStrategy(t.DedupKey); err != nil {
			errs = append(errs, configError(prefix+"DedupKey", "{}: %w", err))
		}
		for topic, spec := range t.DedupKeyByTopic {
			if err := pgrelay.ValidateKeyStrategy(spec); err != nil {
				errs = append(errs, configError(prefix+"DedupKeyByTopic", "{}[%q]: %w", topic, err))
			}
		}
	}
	return names, errs
}

// checkOps checks the operator endpoints' settings, naming the Config
// fields.
func checkOps(cfg Config) []error {
	var errs []error
	for field, addr := range map[string]string{"MetricsAddr": cfg.MetricsAddr, "AdminAddr": cfg.AdminAddr} {
		if addr == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			errs = append(errs, configError(field, "{} %q: %w", addr, err))
		}
	}
	if cfg.AdminAddr != "" {
		if loopback, err := adminhttp.IsLoopback(cfg.AdminAddr); err == nil && !loopback && cfg.AdminToken == "" {
			errs = append(errs, configError("AdminToken", "{} is required: {AdminAddr} %q is not a loopback address", cfg.AdminAddr))
		}
	}
	if cfg.AdminToken != "" && len(cfg.AdminToken) < 16 {
		errs = append(errs, configError("AdminToken", "{} must be at least 16 characters"))
	}
	return errs
}

// Run checks the database (reachable and migrated), binds MetricsAddr and
// AdminAddr, then consumes until ctx is cancelled and shuts down gracefully:
// the batch in hand is stored and acknowledged, the handlers in flight
// finish. It returns nil after a graceful shutdown. Broker and database
// outages while running are retried, never returned; a setting that cannot
// work (a broker unreachable at start-up, a NATS stream outliving the dedup
// window, a busy address, a database without the migrations) is, naming its
// field.
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
			AdminToken: c.cfg.AdminToken, DedupWindow: cmp.Or(c.cfg.Inbox.Retention.Window, pgrelay.DefaultDedupWindow)},
		Struct: "consumer.Config",
		Pool:   c.cfg.Pool, Registry: c.reg, Inbox: true, Logger: c.log,
		Checks: map[string]metrics.Check{
			"database": metrics.PingCheck(c.cfg.Pool),
			"broker": func(context.Context) error {
				if !c.c.Ready() {
					return errors.New("not fetching from the broker")
				}
				return nil
			},
		},
		Broker: c.retention,
		Counters: func() (float64, float64, bool) {
			st := c.c.Stats()
			return float64(st.Fetched), float64(st.Duplicates), true
		},
	})
	if err != nil {
		return fmt.Errorf("consumer: %w", err)
	}
	c.ops = ops
	close(c.started)
	runErr := publicError(c.c.Run(ctx))
	stop() // Run returned on its own: stop the operator endpoints too
	return errors.Join(runErr, ops.Wait())
}

// checkDatabase fails start-up when the database cannot be reached or lacks
// the migrations: consuming into a partial schema would only loop on errors
// while looking alive.
func (c *Consumer) checkDatabase(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.StartupTimeout)
	defer cancel()
	if err := pooler.CheckStart(ctx, c.cfg.Pool); err != nil {
		return setting.Errorf("consumer", "consumer.Config", "Pool", "{}: %w", err)
	}
	return nil
}

// Ready reports whether the consumer is fetching: its last fetch from the
// broker succeeded.
func (c *Consumer) Ready() bool { return c.c.Ready() }

// Stats are a consumer's ingest counters since it started.
type Stats struct {
	// Fetched counts deliveries fetched from the broker, redeliveries included.
	Fetched int64 `json:"fetched"`
	// Inserted counts messages stored as new inbox rows (dead ones included).
	Inserted int64 `json:"inserted"`
	// Duplicates counts fetched messages whose event id the inbox already held.
	Duplicates int64 `json:"duplicates"`
	// Dead counts new inbox rows stored dead at ingest (malformed input).
	Dead int64 `json:"dead"`
	// Acked counts messages acknowledged after their batch committed.
	Acked int64 `json:"acked"`
	// StoreErrors counts failed attempts to store a batch.
	StoreErrors int64 `json:"store_errors"`
	// FetchErrors counts failed fetches (broker unreachable, for example).
	FetchErrors int64 `json:"fetch_errors"`
	// Conflicts counts deliveries whose dedup key was stored with a
	// different payload (every handler together).
	Conflicts int64 `json:"conflicts"`
	// AppliedOnReceive counts events whose handler ran in the transaction
	// that stored them (Config.NoApplyOnReceive).
	AppliedOnReceive int64 `json:"applied_on_receive"`
	// Unacked counts deliveries left unacknowledged while the consumer runs:
	// refused by the database even as dead letters (logged at error with the
	// reason). The broker delivers them again later (NATS after its ack wait,
	// RabbitMQ when the channel closes, Kafka after a rebalance or restart;
	// until then a Kafka partition's committed offset stays before the record).
	Unacked int64 `json:"unacked"`
}

// Stats returns a snapshot of the ingest counters.
func (c *Consumer) Stats() Stats { return Stats(c.c.Stats()) }

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

// register records targets, taking topics, in pgrelay.inbox_subscriptions
// for a relay that stores into pool's inbox (broker/postgres).
func register(pool *pgxpool.Pool, targets []pgrelay.Target, topics []string) func(context.Context) error {
	subs := make([]postgres.Subscription, len(targets))
	for i, t := range targets {
		subs[i] = postgres.Subscription{Handler: t.Handler, DedupKey: t.DedupKey, DedupKeyByTopic: t.DedupKeyByTopic, Topics: topics}
	}
	return func(ctx context.Context) error { return postgres.Register(ctx, pool, subs...) }
}
