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

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/internal/console"
	"github.com/pgrelay/pgrelay/internal/endpoints"
	"github.com/pgrelay/pgrelay/internal/metrics"
	"github.com/pgrelay/pgrelay/internal/pooler"
	"github.com/pgrelay/pgrelay/internal/setting"
)

// Consumer receives events from a broker into the inbox, deduplicated, and
// runs the handler over them exactly once per event, together with inbox
// retention and, when configured, metrics, health checks and the admin API.
// Create it with New and run it with Run.
type Consumer struct {
	cfg     Config
	targets []pgrelay.Target // cfg.targets()
	log     *slog.Logger
	worker  *pgrelay.InboxWorker // nil when cfg.disableWorkers
	acks    *acker               // set while ingest runs with Config.AsyncCommit
	// walReaderOpen tells whether the acker's connection is open.
	walReaderOpen atomic.Bool
	stats         counters
	ready         atomic.Bool
	// hitRatio holds the float64 bits of the dedup hit ratio over the last
	// completed rate interval (see dedupHitRatio).
	hitRatio atomic.Uint64
	// rateLast is closeRateInterval's state (the counts at the last interval's
	// end); only the rate watcher touches it.
	rateLast rateCounts

	reg     *prometheus.Registry
	running atomic.Bool
	started chan struct{}
	ops     *endpoints.Running
	// sub is the subscriber Run created, for the console's broker page.
	sub atomic.Pointer[broker.Subscriber]

	// crashAfterCommit, when set (tests only), is called after a batch
	// committed and before it is acknowledged; returning true abandons the
	// batch unacknowledged, as a process crash at that point would.
	crashAfterCommit func() bool
	// beforeStore, when set (tests only), is called before each attempt to
	// store messages, so a test can break the database connection there.
	beforeStore func([]pgrelay.Incoming)
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
	reg := metrics.NewRegistry()
	var pc *Consumer // set below; the observer reads it only once running
	targets := cfg.withDefaults().targets()
	names := make([]string, len(targets))
	for i, t := range targets {
		names[i] = t.Handler
	}
	observer := metrics.NewInboxObserver(reg, metrics.InboxObserverOptions{
		Handler:  cmp.Or(cfg.Inbox.HandlerName, pgrelay.DefaultHandlerName),
		Handlers: names,
		IngestStats: func() metrics.IngestStats {
			st := pc.Stats()
			return metrics.IngestStats{Received: st.Fetched, Duplicates: st.Duplicates, Dead: st.Dead,
				StoreErrors: st.StoreErrors, FetchErrors: st.FetchErrors, AppliedOnReceive: st.AppliedOnReceive,
				Unacked: st.Unacked, HitRatio: pc.dedupHitRatio()}
		},
	})
	cfg.Inbox.Observer = teeObserver(observer, cfg.Inbox.Observer)
	if o := cfg.Inbox.Retention.Observer; o != nil {
		cfg.Inbox.Retention.Observer = retentionTee{metrics.NewRetentionObserver(reg), o}
	} else {
		cfg.Inbox.Retention.Observer = metrics.NewRetentionObserver(reg)
	}
	cfg.observeReceive, cfg.observeConflicts = observer.ObserveReceive, observer.KeyConflicts
	if subscribe := cfg.Subscribe; subscribe != nil {
		// The subscriber is kept for the web console's retention read.
		cfg.Subscribe = func(ctx context.Context) (broker.Subscriber, error) {
			sub, err := subscribe(ctx)
			if err == nil {
				pc.sub.Store(&sub)
			}
			return sub, err
		}
	}
	var err error
	if pc, err = newConsumer(cfg); err != nil {
		return nil, err
	}
	pc.reg = reg
	return pc, nil
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
	cfg := c.cfg
	ops, err := endpoints.Start(ctx, endpoints.Config{
		Flags: endpoints.Flags{MetricsAddr: cfg.MetricsAddr, AdminAddr: cfg.AdminAddr,
			AdminToken: cfg.AdminToken, DedupWindow: cmp.Or(cfg.Inbox.Retention.Window, pgrelay.DefaultDedupWindow)},
		Struct: "consumer.Config",
		Pool:   cfg.Pool, Registry: c.reg, Inbox: true, Logger: cfg.Logger,
		Checks: map[string]metrics.Check{
			"database": metrics.PingCheck(cfg.Pool),
			"broker": func(context.Context) error {
				if !c.Ready() {
					return errors.New("not fetching from the broker")
				}
				return nil
			},
		},
		Broker: c.retention,
		Counters: func() (float64, float64, bool) {
			st := c.Stats()
			return float64(st.Fetched), float64(st.Duplicates), true
		},
	})
	if err != nil {
		return fmt.Errorf("consumer: %w", err)
	}
	c.ops = ops
	close(c.started)
	runErr := c.consume(ctx)
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
