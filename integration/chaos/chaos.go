// Package chaos proves pgrelay's guarantees under faults. A run starts a
// private PostgreSQL cluster and a broker (a private NATS JetStream server,
// or RabbitMQ under names of the run's own), two relays
// and two consumers as real processes reaching both through in-process
// toxiproxy links, and a producer writing OrderCreated and OrderPaid events in
// business transactions. Faults follow a seeded random schedule: SIGKILL and
// restart, SIGSTOP past the lease then SIGCONT, latency, timeouts, resets and
// full partitions on either link, broker and PostgreSQL restarts, and duplicate,
// out-of-order and poison messages published straight into the broker. After
// a drain with no faults an independent checker reads the database and
// everything the broker stored (the stream; RabbitMQ's audit queue) and
// proves every event was applied exactly once, or is dead with a reason, in
// per-key order, with nothing left behind.
package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pgrelay/pgrelay/internal/db"
	ledgermigrations "github.com/pgrelay/pgrelay/internal/ledger/migrations"
	"github.com/pgrelay/pgrelay/internal/proc"
	"github.com/pgrelay/pgrelay/migrations"
)

// Config configures a chaos run. Zero fields take the documented defaults.
type Config struct {
	// Seed drives the fault schedule and the producer's choices; the same
	// seed gives the same sequence of faults. Default 1.
	Seed uint64
	// Duration is how long faults are injected while the producer writes.
	// Default 50s.
	Duration time.Duration
	// DrainTimeout bounds the quiet phase after the faults in which
	// everything must settle before the check. Default 3m.
	DrainTimeout time.Duration
	// OrdersPerSecond paces the producer. Default 20.
	OrdersPerSecond int
	// BinDir holds prebuilt relay and consumer binaries. Default: built with
	// go build from ModuleRoot into WorkDir.
	BinDir string
	// ModuleRoot is the module's directory, used to build the binaries.
	// Default: found with go env GOMOD.
	ModuleRoot string
	// WorkDir receives the services' logs, the PostgreSQL cluster and the
	// NATS store. Default: a new temporary directory, removed after a run
	// that passes and kept after one that fails.
	WorkDir string
	// RelayLease is the relays' partition lease. Default 3s.
	RelayLease time.Duration
	// ConsumerLease is the consumers' inbox claim lease. Default 4s.
	ConsumerLease time.Duration
	// Out receives the fault log, progress and the report. Default
	// os.Stdout.
	Out io.Writer
	// Broker is the broker the services use: BrokerNATS (a private NATS
	// JetStream server) or BrokerRabbitMQ (the server at AMQPURL, under
	// exchange and queue names of the run's own). Default BrokerNATS.
	Broker string
	// AMQPURL is the RabbitMQ server of a BrokerRabbitMQ run. Default
	// amqp://guest:guest@127.0.0.1:5672/.
	AMQPURL string
	// BrokerRestart lets a BrokerRabbitMQ run restart the (shared) RabbitMQ
	// server with rabbitmqctl stop_app / start_app. A NATS run always
	// restarts its private server. Default false.
	BrokerRestart bool
	// Ordered runs the consumers with --ordered, and the checker then also
	// checks each key's apply order: sequences applied one after the other,
	// none while an earlier one was unapplied, none missing. Default false.
	Ordered bool
	// Capture is the relays' --capture: "table" (the default) or "wal", in
	// which the producer writes its events with pgrelay.Emit, the cluster
	// runs with wal_level = logical and a 3s wal_sender_timeout, and the
	// checker takes the produced events from the producer's commits instead
	// of the outbox table (docs/wal.md). With Ordered, the relays number
	// each key's events as they publish them (docs/wal.md#per-key-sequences).
	Capture string
}

// WithDefaults returns a copy of c with every unset field set to its default.
func (c Config) WithDefaults() Config {
	if c.Seed == 0 {
		c.Seed = 1
	}
	if c.Duration == 0 {
		c.Duration = 50 * time.Second
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = 3 * time.Minute
	}
	if c.OrdersPerSecond == 0 {
		c.OrdersPerSecond = 20
	}
	if c.RelayLease == 0 {
		c.RelayLease = 3 * time.Second
	}
	if c.ConsumerLease == 0 {
		c.ConsumerLease = 4 * time.Second
	}
	if c.Out == nil {
		c.Out = os.Stdout
	}
	if c.Broker == "" {
		c.Broker = BrokerNATS
	}
	if c.AMQPURL == "" {
		c.AMQPURL = "amqp://guest:guest@127.0.0.1:5672/"
	}
	if c.Capture == "" {
		c.Capture = "table"
	}
	return c
}

func (c Config) validate() error {
	var errs []error
	if c.Duration < 0 {
		errs = append(errs, fmt.Errorf("chaos: Duration must be positive, got %s", c.Duration))
	}
	if c.DrainTimeout <= 0 {
		errs = append(errs, fmt.Errorf("chaos: DrainTimeout must be positive, got %s", c.DrainTimeout))
	}
	if c.OrdersPerSecond < 1 || c.OrdersPerSecond > 1000 {
		errs = append(errs, fmt.Errorf("chaos: OrdersPerSecond must be 1-1000, got %d", c.OrdersPerSecond))
	}
	if c.Broker != BrokerNATS && c.Broker != BrokerRabbitMQ && c.Broker != BrokerNATSCluster && c.Broker != BrokerPostgres {
		errs = append(errs, fmt.Errorf("chaos: Broker must be %q, %q, %q or %q, got %q", BrokerNATS, BrokerRabbitMQ, BrokerNATSCluster, BrokerPostgres, c.Broker))
	}
	if c.RelayLease < time.Second || c.ConsumerLease < time.Second {
		errs = append(errs, fmt.Errorf("chaos: RelayLease and ConsumerLease must be at least 1s, got %s and %s", c.RelayLease, c.ConsumerLease))
	}
	if c.Capture != "table" && c.Capture != "wal" {
		errs = append(errs, fmt.Errorf("chaos: Capture must be table or wal, got %q", c.Capture))
	}
	return errors.Join(errs...)
}

// walConf is the cluster's configuration of a WAL capture run.
const walConf = "wal_level = logical\nmax_slot_wal_keep_size = '1GB'\nwal_sender_timeout = '3s'\n"

// run is one chaos run's state.
type run struct {
	cfg     Config
	out     io.Writer
	outMu   sync.Mutex
	started time.Time
	work    string

	pg     *postgresCluster
	broker brokerEnv // direct to the broker: injections and the checker
	kinds  []string  // the fault kinds the schedule draws from
	px     *proxies
	pool   *pgxpool.Pool // direct to PostgreSQL: the producer and the checker
	svcs   []*service
	relay  []*service
	cons   []*service

	prod     *producer
	injected *injections
	faults   []faultRecord
	stalls   map[string][]time.Duration // node-loss stalls of a NATS cluster run
}

// Run performs one chaos run and returns its report. The error is non-nil
// when the run could not be carried out or the checker found a violation.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	r := &run{cfg: cfg, out: cfg.Out, started: time.Now(), injected: newInjections()}
	rep, err := r.run(ctx)
	if rep != nil {
		rep.Seed, rep.WorkDir = cfg.Seed, r.work
		rep.print(r.out)
	}
	if err == nil && rep != nil && !rep.OK() {
		err = fmt.Errorf("chaos: %d violation(s) with seed %d (logs in %s)", len(rep.Violations), cfg.Seed, r.work)
	}
	if err == nil && cfg.WorkDir == "" && r.work != "" {
		_ = os.RemoveAll(r.work)
	}
	return rep, err
}

func (r *run) say(format string, args ...any) {
	r.outMu.Lock()
	defer r.outMu.Unlock()
	fmt.Fprintf(r.out, "[%6.1fs] %s\n", time.Since(r.started).Seconds(), fmt.Sprintf(format, args...))
}

func (r *run) run(ctx context.Context) (*Report, error) {
	var err error
	r.work = r.cfg.WorkDir
	if r.work == "" {
		if r.work, err = os.MkdirTemp("", "pgrelay-chaos-"); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(r.work, 0o755); err != nil {
		return nil, err
	}
	r.say("chaos run: seed %d, faults for %s, work dir %s", r.cfg.Seed, r.cfg.Duration, r.work)

	binDir := r.cfg.BinDir
	if binDir == "" {
		root := r.cfg.ModuleRoot
		if root == "" {
			if root, err = moduleRoot(ctx); err != nil {
				return nil, err
			}
		}
		binDir = filepath.Join(r.work, "bin")
		if err := buildBinaries(ctx, root, binDir); err != nil {
			return nil, err
		}
	}

	extraConf := ""
	if r.cfg.Capture == "wal" {
		extraConf = walConf
	}
	if r.pg, err = startPostgres(ctx, filepath.Join(r.work, "pg"), extraConf); err != nil {
		return nil, err
	}
	defer r.pg.stop()
	bctx, bcancel := context.WithTimeout(ctx, time.Minute)
	defer bcancel()
	switch r.cfg.Broker {
	case BrokerRabbitMQ:
		r.broker, err = startRabbitEnv(bctx, r.cfg.AMQPURL)
	case BrokerNATSCluster:
		r.broker, err = startNATSClusterEnv(bctx, r.work)
	case BrokerPostgres:
		r.broker, err = startPostgresEnv(bctx, r.pg.addr())
	default:
		r.broker, err = startNATSEnv(bctx, r.work)
	}
	if err != nil {
		return nil, err
	}
	defer r.broker.close()
	r.kinds = faultKindsFor(r.cfg.Broker, r.cfg.Broker == BrokerNATS || r.cfg.BrokerRestart)
	if r.px, err = startProxies(r.pg.addr(), r.broker.upstream()); err != nil {
		return nil, err
	}
	defer r.px.stop()
	r.say("private PostgreSQL on %s, %s on %s; services reach them through toxiproxy %s and %s",
		r.pg.addr(), r.broker.label(), r.broker.upstream(), r.px.pg.Listen, r.px.broker.Listen)

	directURL := fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable&connect_timeout=5", r.pg.addr())
	proxiedURL := fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable&connect_timeout=5", r.px.pg.Listen)
	pctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if r.pool, err = pgxpool.New(pctx, directURL); err != nil {
		return nil, err
	}
	defer r.pool.Close()
	sqlDB := stdlib.OpenDBFromPool(r.pool)
	if err := migrations.Up(pctx, sqlDB); err != nil {
		sqlDB.Close()
		return nil, fmt.Errorf("chaos: migrate: %w", err)
	}
	if err := ledgermigrations.Up(pctx, sqlDB); err != nil {
		sqlDB.Close()
		return nil, fmt.Errorf("chaos: migrate: %w", err)
	}
	sqlDB.Close()

	if err := r.startServices(binDir, proxiedURL, r.px.broker.Listen); err != nil {
		return nil, err
	}
	defer func() {
		for _, s := range r.svcs {
			_ = s.proc.Signal(syscall.SIGCONT)
			_ = s.proc.Stop(20 * time.Second)
		}
	}()
	scrapeCtx, stopScrape := context.WithCancel(ctx)
	var scrapeWG sync.WaitGroup
	scrapeWG.Go(func() { r.scrapeLoop(scrapeCtx) })
	defer func() { stopScrape(); scrapeWG.Wait() }()

	// The fault phase: the producer writes while faults strike.
	r.prod = newProducer(r.pool, r.cfg.Seed, r.cfg.OrdersPerSecond, r.say)
	if r.cfg.Capture == "wal" {
		// Logical decoding starts at the slot: emit only once a relay
		// created it.
		if err := r.waitForSlot(ctx); err != nil {
			return nil, err
		}
		r.prod.emit = true
	}
	prodCtx, stopProd := context.WithCancel(ctx)
	var prodWG sync.WaitGroup
	prodWG.Go(func() { r.prod.run(prodCtx) })
	faultErr := r.faultPhase(ctx)
	stopProd()
	prodWG.Wait()
	if faultErr != nil {
		return nil, faultErr
	}
	r.say("fault phase over: %d faults; producer wrote %d orders (%d events acknowledged, %d transactions failed and were retried or abandoned)",
		len(r.faults), r.prod.orders(), len(r.prod.acknowledged()), r.prod.failures())
	if r.cfg.Capture == "wal" {
		table, mixed := r.prod.waysUsed()
		r.say("WAL capture: %d events inserted into pgrelay.outbox_wal, %d emitted; %d transactions did both",
			table, len(r.prod.acknowledged())-table, mixed)
	}

	// The drain: no more faults, everything must settle.
	r.heal()
	drained := r.drain(ctx)
	for _, s := range r.svcs {
		s.scrape(ctx)
	}
	for _, s := range r.svcs {
		if err := s.proc.Stop(30 * time.Second); err != nil {
			r.say("%s: %v", s.name, err)
		}
	}
	stopScrape()
	scrapeWG.Wait()
	r.say("services stopped with SIGTERM; checking")

	cctx, ccancel := context.WithTimeout(ctx, 2*time.Minute)
	defer ccancel()
	rep, err := check(cctx, checkInput{
		pool: r.pool, readLog: r.broker.readLog,
		injected: r.injected.snapshot(), acknowledged: r.prod.acknowledged(), ordered: r.cfg.Ordered,
		emitted: r.prod.emittedEvents(),
	})
	if err != nil {
		return nil, err
	}
	if !drained {
		rep.Violations = append(rep.Violations, fmt.Sprintf("not drained within %s after the faults stopped", r.cfg.DrainTimeout))
	}
	rep.Faults = r.faultCounts()
	rep.FaultLog = r.faults
	rep.NodeLossStalls = r.stalls
	rep.Orders = r.prod.orders()
	rep.ProducerFailures = r.prod.failures()
	rep.InjectedDuplicates = r.injected.duplicates()
	for _, s := range r.svcs {
		m := s.metrics()
		rep.InboxFenced += int64(m["consumer_fenced_total"])
		rep.InboxTakeovers += int64(m["consumer_lease_takeovers_total"])
		rep.ScrapedRetries += int64(m["consumer_retries_total"])
		rep.ScrapedDuplicates += int64(m["consumer_dedup_total"])
		rep.RelayFencedScraped += int64(m["relay_fenced_total"])
		rep.RelayTakeoversScraped += int64(m["relay_lease_takeovers_total"])
		rep.Restarts += s.starts - 1
	}
	rep.InboxFencedLogLines, rep.RelayFenced, rep.RelayTakeovers = r.countLogLines()
	if r.cfg.Capture == "wal" {
		rep.WALTableEvents, rep.WALMixedTxs = r.prod.waysUsed()
		if err := r.pool.QueryRow(cctx, `SELECT count(*) FROM pgrelay.outbox_wal`).Scan(&rep.WALTableLeft); err != nil {
			return nil, fmt.Errorf("chaos: count pgrelay.outbox_wal: %w", err)
		}
	}
	return rep, nil
}

// startServices starts two relays and two consumers.
func (r *run) startServices(binDir, dbURL, brokerAddr string) error {
	common := []string{"DATABASE_URL=" + dbURL, "LOG_LEVEL=info", "LOG_FORMAT=json", "ADMIN_ADDR="}
	relayEnv, consumerEnv := r.broker.serviceEnv(brokerAddr)
	for i := range 2 {
		name := fmt.Sprintf("relay-%d", i+1)
		addr, err := freePort()
		if err != nil {
			return err
		}
		env := append(append(append([]string{}, common...), relayEnv...),
			"RELAY_NODE_ID="+name,
			"RELAY_LEASE="+r.cfg.RelayLease.String(), "RELAY_HEARTBEAT="+(r.cfg.RelayLease/3).String(),
			"RELAY_PUBLISH_TIMEOUT=10s", "RELAY_BATCH_SIZE=100", "RELAY_POLL_INTERVAL=500ms",
			"RELAY_CAPTURE="+r.cfg.Capture,
			fmt.Sprintf("METRICS_ADDR=127.0.0.1:%d", addr))
		if r.cfg.Capture == "wal" {
			// The producer also inserts into pgrelay.outbox_wal: empty
			// it often, so that TRUNCATE runs under the faults.
			env = append(env, "RELAY_WAL_TRUNCATE_INTERVAL=2s")
		}
		s := &service{name: name, metricsAddr: fmt.Sprintf("127.0.0.1:%d", addr),
			proc: proc.New(name, filepath.Join(binDir, "relay"), []string{"run"}, env, filepath.Join(r.work, name+".log"))}
		r.relay = append(r.relay, s)
		r.svcs = append(r.svcs, s)
	}
	for i := range 2 {
		name := fmt.Sprintf("consumer-%d", i+1)
		addr, err := freePort()
		if err != nil {
			return err
		}
		env := append(append(append([]string{}, common...), consumerEnv...),
			"CONSUMER_MAX_WAIT=200ms", "CONSUMER_BATCH_SIZE=100",
			"CONSUMER_LEASE="+r.cfg.ConsumerLease.String(), "CONSUMER_HANDLER_TIMEOUT=2s",
			"CONSUMER_MAX_ATTEMPTS=50", "CONSUMER_STATS_INTERVAL=10s", "CONSUMER_MAX_PAYLOAD_BYTES=65536",
			fmt.Sprintf("METRICS_ADDR=127.0.0.1:%d", addr))
		if r.cfg.Ordered {
			env = append(env, "CONSUMER_ORDERED=true", "CONSUMER_GAP_TIMEOUT=30s")
		}
		s := &service{name: name, metricsAddr: fmt.Sprintf("127.0.0.1:%d", addr),
			proc: proc.New(name, filepath.Join(binDir, "consumer"), []string{"run"}, env, filepath.Join(r.work, name+".log"))}
		r.cons = append(r.cons, s)
		r.svcs = append(r.svcs, s)
	}
	for _, s := range r.svcs {
		if err := s.start(); err != nil {
			return err
		}
	}
	r.say("started %d relays and %d consumers (logs in %s)", len(r.relay), len(r.cons), r.work)
	return nil
}

// heal ends every fault: toxics are removed by the faults themselves; here
// paused processes resume and dead ones restart.
func (r *run) heal() {
	for _, s := range r.svcs {
		_ = s.proc.Signal(syscall.SIGCONT)
		if !s.proc.Running() {
			r.say("%s had exited; restarting it for the drain", s.name)
			_ = s.start()
		}
	}
}

// drain waits, with no faults, until everything produced is published,
// received and settled, and the durable consumer has nothing outstanding.
func (r *run) drain(ctx context.Context) bool {
	start := time.Now()
	deadline := start.Add(r.cfg.DrainTimeout)
	wantInbox := int64(r.injected.distinct())
	stable := 0
	lastLog := time.Time{}
	for time.Now().Before(deadline) {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		p, err := db.New().ChaosProgress(qctx, r.pool)
		var pending, ackPending int64
		if err == nil {
			pending, ackPending, err = r.broker.outstanding(qctx)
		}
		cancel()
		if err == nil {
			if r.cfg.Capture == "wal" { // no outbox rows: what committed is the producer's count
				p.OutboxTotal = int64(len(r.prod.acknowledged()))
			}
			done := p.OutboxPending == 0 && p.InboxOpen == 0 && p.InboxTotal >= p.OutboxTotal+wantInbox && pending == 0 && ackPending <= 0
			if time.Since(lastLog) > 5*time.Second || done {
				lastLog = time.Now()
				r.say("drain: outbox %d pending of %d | inbox %d rows, %d open | %s: %d pending, %d unacked (-1: unknown)",
					p.OutboxPending, p.OutboxTotal, p.InboxTotal, p.InboxOpen, r.broker.label(), pending, ackPending)
			}
			if done {
				stable++
				if stable >= 2 {
					r.say("drained in %s", time.Since(start).Round(time.Millisecond))
					return true
				}
			} else {
				stable = 0
			}
		} else if time.Since(lastLog) > 5*time.Second {
			lastLog = time.Now()
			r.say("drain: progress query: %v", err)
		}
		for _, s := range r.svcs {
			if !s.proc.Running() {
				r.say("%s exited during the drain; restarting it", s.name)
				_ = s.start()
			}
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(time.Second): // polling the database, not waiting for a fixed time
		}
	}
	return false
}

// countLogLines counts the services' own log lines about fencing and lease
// takeovers: the relay has no metrics endpoint, and for the consumers they
// cross-check the scraped counters.
func (r *run) countLogLines() (inboxFenced, relayFenced, relayTakeovers int64) {
	for _, s := range r.svcs {
		b, err := os.ReadFile(filepath.Join(r.work, s.name+".log"))
		if err != nil {
			continue
		}
		text := string(b)
		inboxFenced += int64(strings.Count(text, "inbox event fenced"))
		relayFenced += int64(strings.Count(text, "mark fenced"))
		relayTakeovers += int64(strings.Count(text, `"taken_over":true`))
	}
	return inboxFenced, relayFenced, relayTakeovers
}

func moduleRoot(ctx context.Context) (string, error) {
	root, err := proc.ModuleRoot(ctx)
	if err != nil {
		return "", fmt.Errorf("chaos: %w; set ModuleRoot or BinDir", err)
	}
	return root, nil
}

// newRand returns the seeded generator for one purpose of the run, so that
// the fault schedule does not shift when the producer makes more choices.
func newRand(seed uint64, stream uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, stream))
}

// waitForSlot waits until a relay created the WAL capture's slot.
func (r *run) waitForSlot(ctx context.Context) error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		var n int
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := r.pool.QueryRow(qctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'pgrelay'`).Scan(&n)
		cancel()
		if err == nil && n == 1 {
			r.say("the relays created the replication slot")
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return errors.New("chaos: no relay created the replication slot within a minute")
}
