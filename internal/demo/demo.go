// Package demo runs pgrelay end to end on one machine and checks the result:
// a producer writes orders and their events in business transactions, the
// relay and the consumer run as real processes, duplicates, a poison message
// and out-of-order events are injected straight into the broker (NATS
// JetStream or RabbitMQ), both services are
// killed with SIGKILL mid-run and restarted, and the ledger is then compared
// with the shop's own tables.
package demo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/db"
	"github.com/pgrelay/pgrelay/internal/ledger"
	"github.com/pgrelay/pgrelay/internal/pgurl"
	"github.com/pgrelay/pgrelay/internal/proc"
)

// Config configures a demo run. Zero fields take the documented defaults.
type Config struct {
	// DatabaseURL is the PostgreSQL server to use; the demo creates its own
	// database there (Database) and leaves the server otherwise untouched.
	// Required.
	DatabaseURL string
	// Database is the demo's database, dropped and recreated at the start of
	// every run so that reruns start clean. Default "pgrelay_demo".
	Database string
	// DropDatabase drops Database when the run ends. Default false: the
	// database is kept for inspection.
	DropDatabase bool
	// NATSURL is the NATS JetStream server. Default: empty, which starts an
	// embedded NATS JetStream server inside the demo process (on a free
	// loopback port, storing in WorkDir) and hands its URL to both services;
	// it lives in the demo, not in the relay, so that killing the relay does
	// not take the broker down with it.
	NATSURL string
	// Broker is the broker the services use: BrokerNATS, BrokerRabbitMQ
	// (the server at AMQPURL, under exchange and queue names of the run's
	// own) or BrokerKafka (kfake, an in-memory Kafka started by the demo).
	// Default BrokerNATS.
	Broker string
	// AMQPURL is the RabbitMQ server of a BrokerRabbitMQ run. Default
	// amqp://guest:guest@127.0.0.1:5672/.
	AMQPURL string
	// BinDir holds the relay and consumer binaries. Default: the directory of
	// the running executable, then PATH.
	BinDir string
	// WorkDir receives the services' logs and the embedded NATS data.
	// Default: a new temporary directory, kept for inspection.
	WorkDir string
	// Short runs a smaller, faster demo (for CI): fewer orders and shorter
	// pauses. Default false.
	Short bool
	// Orders is how many orders the producer creates. Default 2000, or 300
	// when Short.
	Orders int
	// Timeout bounds the wait for everything to settle after production.
	// Default 90s.
	Timeout time.Duration
	// Capture is the relay's capture: CaptureTable (producers Enqueue into
	// the outbox table) or CaptureWAL (producers Emit to the WAL, the relay
	// streams a logical replication slot; docs/wal.md). CaptureWAL needs
	// wal_level = logical: on a server without it the demo starts a private
	// cluster (initdb, in a temporary directory) when PostgreSQL's server
	// binaries are at hand, and refuses otherwise. Default CaptureTable.
	Capture string
	// Out receives the progress and the verification. Default os.Stdout.
	Out io.Writer
}

// Captures of Config.Capture.
const (
	CaptureTable = "table"
	CaptureWAL   = "wal"
)

// WithDefaults returns a copy of c with every unset field set to its default.
func (c Config) WithDefaults() Config {
	if c.Database == "" {
		c.Database = "pgrelay_demo"
	}
	if c.Orders == 0 {
		c.Orders = 2000
		if c.Short {
			c.Orders = 300
		}
	}
	if c.Timeout == 0 {
		c.Timeout = 90 * time.Second
	}
	if c.Broker == "" {
		c.Broker = BrokerNATS
	}
	if c.AMQPURL == "" {
		c.AMQPURL = "amqp://guest:guest@127.0.0.1:5672/"
	}
	if c.Out == nil {
		c.Out = os.Stdout
	}
	if c.Capture == "" {
		c.Capture = CaptureTable
	}
	return c
}

func (c Config) validate() error {
	var errs []error
	if c.DatabaseURL == "" {
		errs = append(errs, errors.New("demo: DatabaseURL (--database-url, DATABASE_URL) is required"))
	}
	if c.Orders < 20 {
		errs = append(errs, fmt.Errorf("demo: Orders (--orders) must be at least 20, got %d", c.Orders))
	}
	for _, r := range c.Database {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '_' {
			errs = append(errs, fmt.Errorf("demo: Database (--database) %q may hold only a-z, 0-9 and _", c.Database))
			break
		}
	}
	if c.Broker != BrokerNATS && c.Broker != BrokerRabbitMQ && c.Broker != BrokerPostgres && c.Broker != BrokerKafka {
		errs = append(errs, fmt.Errorf("demo: Broker (--broker) must be %q, %q, %q or %q, got %q", BrokerNATS, BrokerRabbitMQ, BrokerPostgres, BrokerKafka, c.Broker))
	}
	if c.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("demo: Timeout (--timeout) must be positive, got %s", c.Timeout))
	}
	if c.Capture != CaptureTable && c.Capture != CaptureWAL {
		errs = append(errs, fmt.Errorf("demo: Capture (--capture) must be %q or %q, got %q", CaptureTable, CaptureWAL, c.Capture))
	}
	return errors.Join(errs...)
}

// Report is the demo's verification: what happened, and each check's outcome.
type Report struct {
	Orders, PaidOrders        int64 // the shop's truth
	ExpectedCents             int64 // sum of paid orders
	Produced, Published       int64 // outbox rows written / published by the relay
	StreamMessages            int64 // messages the broker stored (JetStream's stream; RabbitMQ's audit queue; the Kafka topic's records)
	InjectedDuplicates        int64 // duplicates published straight to the broker under a new broker id
	BrokerDeduplicated        int64 // duplicates the broker itself dropped (JetStream: same Nats-Msg-Id; RabbitMQ: none)
	Received                  int64 // distinct events stored in the inbox
	DuplicatesAbsorbed        int64 // stream messages the inbox recognised as already stored
	Processed, Dead           int64 // inbox rows by final state
	Retries, Deferrals        int64 // handler retries and out-of-order deferrals
	LedgerEntries             int64 // credits
	CreditedOrders            int64 // distinct orders credited
	CreditedCents             int64 // total credited
	Kills                     int   // SIGKILLs delivered to the services
	DeadLetters               []DeadLetter
	Checks                    []Check
	LogsDir                   string
	ProduceTime, SettleTime   time.Duration
	ExpectedDead, OutOfOrders int64
}

// DeadLetter is one dead inbox row.
type DeadLetter struct {
	EventID, EventType, Reason string
	PayloadBytes               int32
}

// Check is one verification: what was compared and whether it held.
type Check struct {
	Name string
	OK   bool
	Got  string
}

// OK reports whether every check passed.
func (r Report) OK() bool {
	for _, c := range r.Checks {
		if !c.OK {
			return false
		}
	}
	return len(r.Checks) > 0
}

type run struct {
	cfg      Config
	out      io.Writer
	pool     *pgxpool.Pool
	broker   demoBroker
	ob       *pgrelay.Outbox
	relay    *proc.Process
	consumer *proc.Process
	report   Report
	started  time.Time
	// wal is the WAL capture's state (Capture CaptureWAL), else nil.
	wal *walRun
}

// Run runs the demo and returns its report. The error is non-nil when the
// demo could not run; a run whose checks fail returns a report with OK()
// false and an error saying so.
func Run(ctx context.Context, cfg Config) (Report, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return Report{}, err
	}
	r := &run{cfg: cfg, out: cfg.Out, started: time.Now()}
	err := r.run(ctx)
	if err != nil {
		return r.report, err
	}
	if !r.report.OK() {
		return r.report, errors.New("demo: verification FAILED")
	}
	return r.report, nil
}

func (r *run) say(format string, args ...any) {
	fmt.Fprintf(r.out, "[%5.1fs] %s\n", time.Since(r.started).Seconds(), fmt.Sprintf(format, args...))
}

func (r *run) run(ctx context.Context) error {
	relayBin, err := findBinary(r.cfg.BinDir, "relay")
	if err != nil {
		return err
	}
	consumerBin, err := findBinary(r.cfg.BinDir, "consumer")
	if err != nil {
		return err
	}
	work := r.cfg.WorkDir
	if work == "" {
		if work, err = os.MkdirTemp("", "pgrelay-demo-"); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(work, 0o755); err != nil {
		return err
	}
	r.report.LogsDir = work

	if r.cfg.Capture == CaptureWAL {
		stop, err := r.walServer(ctx)
		if err != nil {
			return err
		}
		defer stop()
	}
	// A fresh database.
	dbURL, cleanup, err := r.freshDatabase(ctx)
	if err != nil {
		return err
	}
	defer cleanup()
	r.say("database %q created; applying migrations and the example schema (consumer migrate up --example-schema)", r.cfg.Database)
	dbEnv := []string{"DATABASE_URL=" + dbURL, "LOG_FORMAT=json"}
	if err := runOnce(ctx, consumerBin, dbEnv, "migrate", "up", "--example-schema"); err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if r.pool, err = pgxpool.New(pctx, dbURL); err != nil {
		return fmt.Errorf("demo: connect to %s: %w", r.cfg.Database, err)
	}
	defer r.pool.Close()
	if r.ob, err = pgrelay.NewOutbox(pgrelay.OutboxConfig{}); err != nil {
		return err
	}

	// The broker: NATS (embedded unless NATS_URL is given) or RabbitMQ.
	bctx, bcancel := context.WithTimeout(ctx, 30*time.Second)
	defer bcancel()
	switch r.cfg.Broker {
	case BrokerRabbitMQ:
		r.broker, err = startRabbitBroker(bctx, r.cfg, r.say)
	case BrokerPostgres:
		r.broker, err = startPostgresBroker(bctx, r.pool, r.say)
	case BrokerKafka:
		r.broker, err = startKafkaBroker(bctx, r.say)
	default:
		r.broker, err = startNATSBroker(bctx, r.cfg, work, r.say)
	}
	if err != nil {
		return err
	}
	defer r.broker.close()
	relayEnv, consumerEnv := r.broker.serviceEnv()
	if r.wal != nil {
		relayEnv = append(relayEnv, r.wal.relayEnv()...)
	}

	// The services, as real processes.
	r.relay = proc.New("relay", relayBin, []string{"run"},
		append(append(append([]string{}, dbEnv...), relayEnv...),
			"RELAY_LEASE=3s", "METRICS_ADDR=", "ADMIN_ADDR="), filepath.Join(work, "relay.log"))
	r.consumer = proc.New("consumer", consumerBin, []string{"run"},
		append(append(append([]string{}, dbEnv...), consumerEnv...),
			"CONSUMER_MAX_PAYLOAD_BYTES=65536",
			"CONSUMER_STATS_INTERVAL=5s",
			"CONSUMER_LEASE=5s", "CONSUMER_HANDLER_TIMEOUT=2s", "METRICS_ADDR=", "ADMIN_ADDR="), filepath.Join(work, "consumer.log"))
	for _, p := range []*proc.Process{r.relay, r.consumer} {
		if err := p.Start(); err != nil {
			return err
		}
		defer func() { _ = p.Stop(20 * time.Second) }()
	}
	r.say("relay and consumer started (logs in %s)", work)
	if r.wal != nil {
		if err := r.waitSlot(ctx); err != nil {
			return err
		}
	}

	if err := r.produce(ctx); err != nil {
		return err
	}
	if err := r.settle(ctx); err != nil {
		return err
	}
	// Graceful stop, then the verification.
	for _, p := range []*proc.Process{r.relay, r.consumer} {
		if err := p.Stop(20 * time.Second); err != nil {
			r.say("%s stop: %v", p.Name(), err)
		}
	}
	r.say("relay and consumer stopped with SIGTERM")
	if r.wal != nil {
		defer r.dropSlot()
	}
	if err := r.verify(ctx); err != nil {
		return err
	}
	r.print()
	return nil
}

func (r *run) freshDatabase(ctx context.Context) (string, func(), error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, r.cfg.DatabaseURL)
	if err != nil {
		return "", nil, fmt.Errorf("demo: connect to PostgreSQL (--database-url, DATABASE_URL): %w", err)
	}
	defer admin.Close(context.Background())
	name := pgx.Identifier{r.cfg.Database}.Sanitize()
	// A previous WAL run's slot (its relay gone) would keep the database.
	if _, err := admin.Exec(ctx, `SELECT pg_catalog.pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1 AND NOT active`, r.cfg.Database); err != nil {
		return "", nil, fmt.Errorf("demo: drop the replication slots of %s: %w", name, err)
	}
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
		return "", nil, fmt.Errorf("demo: drop database %s: %w", name, err)
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return "", nil, fmt.Errorf("demo: create database %s: %w", name, err)
	}
	u := pgurl.WithDatabase(r.cfg.DatabaseURL, r.cfg.Database)
	cleanup := func() {
		if !r.cfg.DropDatabase {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if admin, err := pgx.Connect(ctx, r.cfg.DatabaseURL); err == nil {
			_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
			admin.Close(ctx)
		}
	}
	return u, cleanup, nil
}

// produce writes the orders and injects the faults, reporting progress.
func (r *run) produce(ctx context.Context) error {
	n := r.cfg.Orders
	duration := 20 * time.Second
	if r.cfg.Short {
		duration = 8 * time.Second
	}
	pace := duration / time.Duration(n)
	late := int64(10)
	if r.cfg.Short {
		late = 5
	}
	r.report.OutOfOrders = late
	start := time.Now()

	// Out of order: payments published straight to the broker before their
	// orders exist; the ledger defers them until OrderCreated arrives.
	for i := range late {
		o := lateOrder(i)
		if err := r.publishRaw(ctx, uuid.NewString(), "", ledger.EventOrderPaid,
			mustJSON(ledger.OrderPaid{OrderID: o.id, AmountCents: o.amount, Currency: "EUR"}), ""); err != nil {
			return err
		}
	}
	r.say("injected %d OrderPaid events ahead of their OrderCreated", late)

	lastTick := time.Now()
	for i := range n {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := r.order(ctx, shopOrder(i), i%5 != 4); err != nil {
			return err
		}
		switch i {
		case n / 5:
			if err := r.injectPoison(ctx); err != nil {
				return err
			}
		case n / 3:
			r.consumer.Kill()
			r.report.Kills++
			r.say("SIGKILL consumer (order %d/%d)", i, n)
		case n/3 + n/20:
			if err := r.consumer.Start(); err != nil {
				return err
			}
			r.say("consumer restarted")
		case n / 2:
			if err := r.injectDuplicates(ctx, int32(n/4)); err != nil {
				return err
			}
			// The late orders' creation: their payments are already waiting.
			for j := range late {
				if err := r.order(ctx, lateOrder(j), false); err != nil {
					return err
				}
				if err := r.markPaid(ctx, lateOrder(j).id); err != nil {
					return err
				}
			}
		case 2 * n / 3:
			r.relay.Kill()
			r.report.Kills++
			r.say("SIGKILL relay (order %d/%d)", i, n)
		case 2*n/3 + n/20:
			if err := r.relay.Start(); err != nil {
				return err
			}
			r.say("relay restarted")
		}
		if time.Since(lastTick) >= time.Second {
			lastTick = time.Now()
			r.progress(ctx, fmt.Sprintf("produced %d/%d orders", i+1, n))
		}
		time.Sleep(pace) // pacing the producer, not waiting for anything
	}
	r.report.ProduceTime = time.Since(start)
	r.say("producer done: %d orders in %s", n+int(late), r.report.ProduceTime.Round(time.Millisecond))
	return nil
}

type orderSpec struct {
	id, customer string
	amount       int64
}

func shopOrder(i int) orderSpec {
	return orderSpec{id: fmt.Sprintf("order-%05d", i), customer: fmt.Sprintf("cust-%03d", i%97), amount: 100 + int64(i*7919%10000)}
}

func lateOrder(i int64) orderSpec {
	return orderSpec{id: fmt.Sprintf("late-%03d", i), customer: "cust-late", amount: 5000 + 10*i}
}

// order creates an order and its OrderCreated event in one transaction, then,
// when pay is set, pays it with its OrderPaid event in another.
func (r *run) order(ctx context.Context, o orderSpec, pay bool) error {
	err := r.producerTx(ctx, func(tx pgx.Tx) error {
		if err := db.New().CreateShopOrder(ctx, tx, db.CreateShopOrderParams{
			OrderID: o.id, CustomerID: o.customer, AmountCents: o.amount, Currency: "EUR",
		}); err != nil {
			return err
		}
		return r.put(ctx, tx, pgrelay.Message{
			Topic: "orders", Key: o.id, EventType: ledger.EventOrderCreated,
			Payload: mustJSON(ledger.OrderCreated{OrderID: o.id, CustomerID: o.customer, AmountCents: o.amount, Currency: "EUR"}),
		})
	})
	if err != nil || !pay {
		return err
	}
	return r.producerTx(ctx, func(tx pgx.Tx) error {
		if _, err := db.New().MarkShopOrderPaid(ctx, tx, o.id); err != nil {
			return err
		}
		return r.put(ctx, tx, pgrelay.Message{
			Topic: "orders", Key: o.id, EventType: ledger.EventOrderPaid,
			Payload: mustJSON(ledger.OrderPaid{OrderID: o.id, AmountCents: o.amount, Currency: "EUR"}),
		})
	})
}

func (r *run) markPaid(ctx context.Context, orderID string) error {
	return r.tx(ctx, func(tx pgx.Tx) error {
		_, err := db.New().MarkShopOrderPaid(ctx, tx, orderID)
		return err
	})
}

func (r *run) tx(ctx context.Context, f func(pgx.Tx) error) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pgx.BeginFunc(ctx, r.pool, f); err != nil {
		return fmt.Errorf("demo: producer transaction: %w", err)
	}
	return nil
}

// publishRaw publishes straight to the broker, bypassing the outbox, with the
// relay's headers. An empty msgID publishes without a broker dedup id.
func (r *run) publishRaw(ctx context.Context, eventID, msgID, eventType string, payload []byte, key string) error {
	_, err := r.publish(ctx, eventID, msgID, eventType, payload, key)
	return err
}

func (r *run) publish(ctx context.Context, eventID, msgID, eventType string, payload []byte, key string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return r.broker.publish(ctx, eventID, msgID, eventType, payload, key)
}

// injectPoison publishes malformed messages; each must end dead with its
// reason, and none may stop the consumer.
func (r *run) injectPoison(ctx context.Context) error {
	poison := []struct {
		what         string
		id, typ      string
		payload      []byte
		withoutIDHdr bool
	}{
		{"OrderPaid whose amount_cents is a string", uuid.NewString(), ledger.EventOrderPaid, []byte(`{"order_id":"order-00001","amount_cents":"lots","currency":"EUR"}`), false},
		{"payload that is not JSON", uuid.NewString(), ledger.EventOrderCreated, []byte(`{"order_id": "order-00002", oops`), false},
		{"unknown event type", uuid.NewString(), "OrderRefunded", []byte(`{"order_id":"order-00003"}`), false},
		{"payload that is not UTF-8", uuid.NewString(), ledger.EventOrderPaid, []byte{'{', 0xff, 0xfe, '}'}, false},
		{"message without any event id", "", ledger.EventOrderPaid, []byte(`{"order_id":"order-00004","amount_cents":1,"currency":"EUR"}`), true},
		{"oversized payload (100 KiB)", uuid.NewString(), ledger.EventOrderPaid, []byte(`{"pad":"` + strings.Repeat("x", 100<<10) + `"}`), false},
	}
	for _, p := range poison {
		if err := r.publishRaw(ctx, p.id, p.id, p.typ, p.payload, ""); err != nil {
			return err
		}
	}
	r.report.ExpectedDead = int64(len(poison))
	r.say("injected %d poison messages (bad JSON types, not JSON, unknown type, not UTF-8, no event id, oversized)", len(poison))
	return nil
}

// injectDuplicates republishes published events straight to the broker,
// three times each: once under the same broker id (JetStream drops it;
// RabbitMQ, without dedup, keeps it) and twice under new ones (they reach the
// consumer, and the inbox must absorb them).
func (r *run) injectDuplicates(ctx context.Context, max int32) error {
	rows, err := r.publishedEvents(ctx, max)
	if err != nil {
		return err
	}
	for _, row := range rows {
		dropped, err := r.publish(ctx, row.EventID, row.EventID, row.EventType, row.Payload, row.Key)
		if err != nil {
			return err
		}
		if dropped {
			r.report.BrokerDeduplicated++
		} else if r.broker.dedupName() == "" {
			r.report.InjectedDuplicates++ // no broker dedup: it reaches the consumer
		}
		for copyN := range 2 {
			if _, err := r.publish(ctx, row.EventID, fmt.Sprintf("replay-%d-%s", copyN, row.EventID), row.EventType, row.Payload, row.Key); err != nil {
				return err
			}
			r.report.InjectedDuplicates++
		}
	}
	if name := r.broker.dedupName(); name != "" {
		r.say("injected %d duplicate deliveries of %d published events (%d more dropped by %s's own dedup)",
			r.report.InjectedDuplicates, len(rows), r.report.BrokerDeduplicated, name)
	} else {
		r.say("injected %d duplicate deliveries of %d published events (the broker has no dedup: the inbox absorbs them all)",
			r.report.InjectedDuplicates, len(rows))
	}
	return nil
}

// settle waits until everything produced has been published, received and
// processed, or the timeout passes.
func (r *run) settle(ctx context.Context) error {
	start := time.Now()
	deadline := start.Add(r.cfg.Timeout)
	for {
		done, line := r.state(ctx)
		r.say("%s", line)
		if done {
			r.report.SettleTime = time.Since(start)
			r.say("settled in %s", r.report.SettleTime.Round(time.Millisecond))
			return nil
		}
		if time.Now().After(deadline) {
			r.say("not settled within %s; verifying what there is", r.cfg.Timeout)
			return nil
		}
		if !r.relay.Running() || !r.consumer.Running() {
			return fmt.Errorf("demo: a service exited unexpectedly; see the logs in %s", r.report.LogsDir)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func (r *run) progress(ctx context.Context, prefix string) {
	_, line := r.state(ctx)
	r.say("%s | %s", prefix, line)
}

// state reads the counters and reports whether the pipeline has drained.
func (r *run) state(ctx context.Context) (bool, string) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	q := db.New()
	ob, err1 := q.DemoOutboxCounts(ctx, r.pool)
	in, err2 := q.DemoInboxCounts(ctx, r.pool)
	lg, err3 := q.DemoLedgerCheck(ctx, r.pool)
	shop, err4 := q.ShopTotals(ctx, r.pool)
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return false, "reading counters: " + err.Error()
	}
	line := fmt.Sprintf("outbox %d published/%d | inbox %d received, %d processed, %d dead, %d open | ledger %d credits",
		ob.Published, ob.Total, in.Total, in.Processed, in.Dead, in.Open, lg.Entries)
	produced := ob.Total
	if r.wal != nil {
		produced = r.wal.emitted()
		line = fmt.Sprintf("emitted %d (WAL) | inbox %d received, %d processed, %d dead, %d open | ledger %d credits",
			produced, in.Total, in.Processed, in.Dead, in.Open, lg.Entries)
	}
	expectedInbox := produced + r.report.OutOfOrders + r.report.ExpectedDead
	done := ob.Published+ob.Dead == ob.Total && in.Total >= expectedInbox && in.Open == 0 && lg.Entries >= shop.PaidOrders
	return done, line
}

// verify compares the ledger with the shop's truth and records each check.
func (r *run) verify(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	q := db.New()
	shop, err := q.ShopTotals(ctx, r.pool)
	if err != nil {
		return err
	}
	ob, err := q.DemoOutboxCounts(ctx, r.pool)
	if err != nil {
		return err
	}
	in, err := q.DemoInboxCounts(ctx, r.pool)
	if err != nil {
		return err
	}
	lg, err := q.DemoLedgerCheck(ctx, r.pool)
	if err != nil {
		return err
	}
	dead, err := q.DemoDeadLetters(ctx, r.pool)
	if err != nil {
		return err
	}
	stored, err := r.broker.stored(ctx)
	if err != nil {
		return err
	}
	var ledgerOrders int64
	if err := r.pool.QueryRow(ctx, "SELECT pg_catalog.count(*) FROM ledger_orders").Scan(&ledgerOrders); err != nil { // a one-off count for the report
		return err
	}

	rep := &r.report
	rep.Orders, rep.PaidOrders, rep.ExpectedCents = shop.Orders, shop.PaidOrders, shop.PaidCents
	rep.Produced, rep.Published = ob.Total, ob.Published
	if r.wal != nil {
		if err := r.verifyWAL(ctx); err != nil {
			return err
		}
	}
	rep.StreamMessages = stored
	rep.Received, rep.Processed, rep.Dead = in.Total, in.Processed, in.Dead
	rep.Retries, rep.Deferrals = in.Retries, in.Deferrals
	rep.DuplicatesAbsorbed = rep.StreamMessages - rep.Received
	rep.LedgerEntries, rep.CreditedOrders, rep.CreditedCents = lg.Entries, lg.CreditedOrders, lg.TotalCents
	for _, d := range dead {
		dl := DeadLetter{EventID: d.EventID, EventType: d.EventType, PayloadBytes: d.PayloadBytes}
		if d.LastError != nil {
			dl.Reason = *d.LastError
		}
		rep.DeadLetters = append(rep.DeadLetters, dl)
	}

	check := func(name string, ok bool, format string, args ...any) {
		rep.Checks = append(rep.Checks, Check{Name: name, OK: ok, Got: fmt.Sprintf(format, args...)})
	}
	if r.wal == nil {
		check("every outbox event published", ob.Published == ob.Total && ob.Dead == 0,
			"%d of %d published, %d dead", ob.Published, ob.Total, ob.Dead)
	} else {
		r.wal.checks(check, ob, rep)
	}
	wantRows := rep.Produced + rep.OutOfOrders + rep.ExpectedDead
	check("every event received exactly once", in.Total == wantRows,
		"%d inbox rows, want %d (%d relayed + %d out-of-order + %d poison)", in.Total, wantRows, rep.Produced, rep.OutOfOrders, rep.ExpectedDead)
	check("duplicates absorbed by the inbox", rep.DuplicatesAbsorbed >= rep.InjectedDuplicates,
		"%d stream messages for %d events: %d absorbed, %d injected", rep.StreamMessages, in.Total, rep.DuplicatesAbsorbed, rep.InjectedDuplicates)
	check("nothing left pending", in.Open == 0, "%d pending or processing", in.Open)
	check("only the poison messages are dead", in.Dead == rep.ExpectedDead && in.Processed == in.Total-in.Dead,
		"%d dead, want %d", in.Dead, rep.ExpectedDead)
	reasons := true
	for _, d := range rep.DeadLetters {
		reasons = reasons && d.Reason != ""
	}
	check("every dead letter has a reason", reasons, "%d dead letters", len(rep.DeadLetters))
	check("every order known to the ledger", ledgerOrders == shop.Orders, "%d ledger orders, %d shop orders", ledgerOrders, shop.Orders)
	check("one credit per paid order", lg.Entries == shop.PaidOrders && lg.CreditedOrders == lg.Entries,
		"%d credits for %d distinct orders, %d paid orders", lg.Entries, lg.CreditedOrders, shop.PaidOrders)
	check("total credited == total paid", lg.TotalCents == shop.PaidCents,
		"%s credited, %s paid", cents(lg.TotalCents), cents(shop.PaidCents))
	return nil
}

func (r *run) print() {
	rep := r.report
	w := r.out
	fmt.Fprintf(w, "\n==================== pgrelay demo: verification ====================\n")
	fmt.Fprintf(w, "  shop orders                    %8d (%d paid, %s)\n", rep.Orders, rep.PaidOrders, cents(rep.ExpectedCents))
	if r.wal != nil {
		fmt.Fprintf(w, "  events emitted (WAL capture)   %8d\n", rep.Produced)
	} else {
		fmt.Fprintf(w, "  events produced (outbox)       %8d\n", rep.Produced)
	}
	fmt.Fprintf(w, "  events published by the relay  %8d\n", rep.Published)
	fmt.Fprintf(w, "  injected out of order          %8d (OrderPaid before OrderCreated)\n", rep.OutOfOrders)
	fmt.Fprintf(w, "  injected duplicates            %8d (+%d dropped by the broker's dedup)\n", rep.InjectedDuplicates, rep.BrokerDeduplicated)
	fmt.Fprintf(w, "  messages in the stream         %8d\n", rep.StreamMessages)
	fmt.Fprintf(w, "  events received (inbox rows)   %8d\n", rep.Received)
	fmt.Fprintf(w, "  duplicates absorbed            %8d (plus redeliveries after the SIGKILLs)\n", rep.DuplicatesAbsorbed)
	fmt.Fprintf(w, "  processed                      %8d\n", rep.Processed)
	fmt.Fprintf(w, "  handler retries / deferrals    %8d / %d (retries include takeovers after a SIGKILL)\n", rep.Retries, rep.Deferrals)
	fmt.Fprintf(w, "  SIGKILLs (consumer, relay)     %8d\n", rep.Kills)
	fmt.Fprintf(w, "  dead letters                   %8d\n", rep.Dead)
	for _, d := range rep.DeadLetters {
		fmt.Fprintf(w, "    - %s (%s, %d bytes): %s\n", d.EventID, orDash(d.EventType), d.PayloadBytes, d.Reason)
	}
	fmt.Fprintf(w, "  ledger credits                 %8d (%d orders)\n", rep.LedgerEntries, rep.CreditedOrders)
	fmt.Fprintf(w, "  total credited                 %s (expected %s)\n", cents(rep.CreditedCents), cents(rep.ExpectedCents))
	fmt.Fprintf(w, "\n")
	for _, c := range rep.Checks {
		mark := "PASS"
		if !c.OK {
			mark = "FAIL"
		}
		fmt.Fprintf(w, "  [%s] %-36s %s\n", mark, c.Name, c.Got)
	}
	if rep.OK() {
		fmt.Fprintf(w, "\nRESULT: PASS. Every paid order credited exactly once, nothing lost. (logs: %s)\n", rep.LogsDir)
	} else {
		fmt.Fprintf(w, "\nRESULT: FAIL (logs: %s)\n", rep.LogsDir)
	}
}

func cents(c int64) string { return fmt.Sprintf("%d.%02d EUR", c/100, c%100) }

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only called with the ledger's plain structs
	}
	return b
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
