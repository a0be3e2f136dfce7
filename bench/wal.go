package main

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/nats"
	"github.com/pgrelay/pgrelay/consumer"
	"github.com/pgrelay/pgrelay/internal/ledger"
	"github.com/pgrelay/pgrelay/internal/logbridge"
	"github.com/pgrelay/pgrelay/internal/testcluster"
	"github.com/pgrelay/pgrelay/relay"
)

// The wal group measures the WAL capture (docs/wal.md) against the table
// outbox on a private cluster with wal_level = logical, started for the
// group (internal/testcluster: initdb, fsync off; the shared server keeps its
// settings). Both modes run there, so each ratio compares like with like.

// walClusterConf is the private cluster's configuration.
const walClusterConf = "wal_level = logical\nmax_slot_wal_keep_size = '4GB'\nmax_replication_slots = 10\nmax_wal_senders = 10\nmax_connections = 200"

// walLoad is the offered load of the latency figures, in events/s.
const walLoad = 500

// emitBacklog writes $2 OrderPaid events with ids $1 || i in one transaction
// with pgrelay.emit: the WAL relay drain's backlog, as seedOutboxPending is
// the table's.
const emitBacklog = `SELECT count(pgrelay.emit('orders',
       convert_to(json_build_object('order_id', 'order-' || (i % 1000), 'amount_cents', 100 + i % 900, 'currency', 'EUR')::text, 'UTF8'),
       key => 'order-' || (i % 1000), event_type => 'OrderPaid', event_id => $1::text || i))
FROM generate_series(0, $2::int - 1) AS i`

func (b *bench) declareWALFigures(add func(id, group, name, unit, mode, floor string, target *Target, note string)) {
	ratio := func(v float64, text string) *Target { return &Target{Kind: "ratio>=", Value: v, Text: text} }
	atMost := func(v float64, text string) *Target { return &Target{Kind: "<=", Value: v, Text: text} }
	conns := strconv.Itoa(producerConns)
	load := strconv.Itoa(walLoad)
	add("wal_producer_plain", "wal", "producer floor: plain-table INSERT in a 1-row transaction, "+conns+" connections (wal_level=logical)", unitRate, "sql", "", nil, "")
	add("wal_producer_emit", "wal", "producer: pgrelay.Emit in a 1-event transaction, "+conns+" connections", unitRate, "sql", "wal_producer_plain", ratio(1.0, "≥ 1.0× plain insert"), "")
	add("wal_producer_outbox", "wal", "  producer: pgrelay.Enqueue (table outbox) in a 1-event transaction, same run", unitRate, "sql", "wal_producer_plain", nil, "")
	for _, m := range []string{"wal", "table"} {
		var p50 *Target
		if m == "wal" {
			p50 = atMost(3, "p50 ≤ 3 ms")
		}
		add("wal_pub_"+m+"_p50", "wal", "commit→published p50 at "+load+"/s, "+m+" capture", unitMs, "in-process", "", p50, "")
		add("wal_pub_"+m+"_p99", "wal", "commit→published p99 at "+load+"/s, "+m+" capture", unitMs, "in-process", "", nil, "")
		add("wal_effect_"+m+"_p50", "wal", "commit→ledger p50 at "+load+"/s, "+m+" capture", unitMs, "in-process", "", nil, "")
		add("wal_effect_"+m+"_p99", "wal", "commit→ledger p99 at "+load+"/s, "+m+" capture", unitMs, "in-process", "", nil, "")
	}
	add("wal_relay_table", "wal", "relay drain, table capture (backlog → NATS, marked)", unitRate, "in-process", "", nil, "")
	add("wal_relay_wal", "wal", "relay drain, WAL capture (backlog → NATS, confirmed)", unitRate, "in-process", "wal_relay_table", nil, "")
}

// runWALGroup measures the wal group on a private cluster.
func (b *bench) runWALGroup(ctx context.Context) {
	all := []string{"wal_producer_plain", "wal_producer_emit", "wal_producer_outbox", "wal_relay_table", "wal_relay_wal"}
	for _, m := range []string{"wal", "table"} {
		all = append(all, "wal_pub_"+m+"_p50", "wal_pub_"+m+"_p99", "wal_effect_"+m+"_p50", "wal_effect_"+m+"_p99")
	}
	setup, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	c, err := testcluster.New(setup, walClusterConf)
	if c != nil {
		defer c.Remove()
	}
	if err != nil {
		b.fail(all, fmt.Errorf("private wal_level=logical cluster: %w", err))
		return
	}
	dbs, err := newDatabases(setup, c.URL(), b.log)
	if err != nil {
		b.fail(all, fmt.Errorf("private cluster databases: %w", err))
		return
	}
	defer dbs.dropAll()
	b.res.Settings["wal_cluster"] = "private cluster (initdb), " + strings.ReplaceAll(walClusterConf, "\n", ", ") + ", fsync off"

	for range b.cfg.Repeats {
		b.attempt(ctx, "wal producer commit path", []string{"wal_producer_plain", "wal_producer_emit", "wal_producer_outbox"}, func(ctx context.Context) error {
			return b.walProducers(ctx, dbs)
		})
	}
	b.note("wal_producer_emit", strconv.Itoa(producerConns)+" connections, "+strconv.Itoa(b.cfg.Events)+" transactions each of BEGIN, one event, COMMIT; the three variants take turns; no relay and no slot")
	for range b.cfg.Repeats {
		for _, m := range []string{relay.CaptureWAL, relay.CaptureTable} {
			ids := []string{"wal_pub_" + m + "_p50", "wal_pub_" + m + "_p99", "wal_effect_" + m + "_p50", "wal_effect_" + m + "_p99"}
			b.attempt(ctx, "latency, "+m+" capture", ids, func(ctx context.Context) error {
				return b.walLatency(ctx, dbs, m)
			})
		}
	}
	b.note("wal_pub_wal_p50", fmt.Sprintf("%s of open-loop load, 1 event/tx, %d producers (Emit; Enqueue for the table); published = the broker acknowledged the relay's publish", b.cfg.LoadDuration, producerConns))
	b.note("wal_effect_wal_p50", "consumer (default settings, ledger.Handler) in the same process; the observer polls the ledger every 1 ms")
	for range b.cfg.Repeats {
		b.attempt(ctx, "relay drain, table capture", []string{"wal_relay_table"}, func(ctx context.Context) error {
			pool, _, err := dbs.fresh(ctx, 4)
			if err != nil {
				return err
			}
			defer pool.Close()
			d, err := b.relayDrain(ctx, pool, b.cfg.Events, relayOptions{instances: 1})
			if err != nil {
				return err
			}
			b.sample("wal_relay_table", rate(b.cfg.Events, d))
			return nil
		})
		b.attempt(ctx, "relay drain, WAL capture", []string{"wal_relay_wal"}, func(ctx context.Context) error {
			d, err := b.walDrain(ctx, dbs, b.cfg.Events)
			if err != nil {
				return err
			}
			b.sample("wal_relay_wal", rate(b.cfg.Events, d))
			return nil
		})
	}
	b.note("wal_relay_wal", fmt.Sprintf("one relay, batch %d; a backlog of %d events committed in one transaction while the relay runs, until the last is acknowledged", b.cfg.BatchSize, b.cfg.Events))
}

// walProducers times producerConns connections committing one event per
// transaction with a plain insert, with Emit and with Enqueue, in turns.
func (b *bench) walProducers(ctx context.Context, dbs *databases) error {
	n := b.cfg.Events
	pool, _, err := dbs.fresh(ctx, producerConns+1)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, floorSchema); err != nil {
		return fmt.Errorf("floor schema: %w", err)
	}
	type variant struct {
		gen generator
		tx  func(ctx context.Context, tx pgx.Tx, e genEvent) error
		d   time.Duration
	}
	msg := func(e genEvent) pgrelay.Message {
		return pgrelay.Message{EventID: e.id, Topic: topic, Key: e.key, EventType: eventType, Payload: e.payload}
	}
	variants := []*variant{
		{gen: newGenerator("plain"), tx: func(ctx context.Context, tx pgx.Tx, e genEvent) error {
			_, err := tx.Exec(ctx, floorOutboxInsertOne, e.id, topic, e.key, eventType, e.payload)
			return err
		}},
		{gen: newGenerator("emit"), tx: func(ctx context.Context, tx pgx.Tx, e genEvent) error { return pgrelay.Emit(ctx, tx, msg(e)) }},
		{gen: newGenerator("outbox"), tx: func(ctx context.Context, tx pgx.Tx, e genEvent) error { return pgrelay.Enqueue(ctx, tx, msg(e)) }},
	}
	for r := range producerSlices {
		lo, hi := r*n/producerSlices, (r+1)*n/producerSlices
		for _, v := range variants {
			var next atomic.Int64
			next.Store(int64(lo))
			d, err := timed(func() error {
				return fanOut(ctx, producerConns, func(ctx context.Context, _ int) error {
					for {
						i := int(next.Add(1)) - 1
						if i >= hi {
							return nil
						}
						e := v.gen.event(i)
						if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return v.tx(ctx, tx, e) }); err != nil {
							return fmt.Errorf("%s: %w", v.gen.prefix, err)
						}
					}
				})
			})
			if err != nil {
				return err
			}
			v.d += d
		}
	}
	b.sample("wal_producer_plain", rate(n, variants[0].d))
	b.sample("wal_producer_emit", rate(n, variants[1].d))
	b.sample("wal_producer_outbox", rate(n, variants[2].d))
	return nil
}

// ackClock wraps a publisher and records when the broker acknowledged each
// event (by id), and how many it acknowledged.
type ackClock struct {
	broker.Publisher
	mu    sync.Mutex
	at    map[string]int64 // event id -> UnixNano of the first acknowledgement
	acked atomic.Int64
}

func newAckClock(p broker.Publisher) *ackClock {
	return &ackClock{Publisher: p, at: map[string]int64{}}
}

func (a *ackClock) Publish(ctx context.Context, msgs []pgrelay.Message) []broker.Result {
	res := a.Publisher.Publish(ctx, msgs)
	now := time.Now().UnixNano()
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, r := range res {
		if r.Err != nil {
			continue
		}
		if _, ok := a.at[msgs[i].EventID]; !ok {
			a.at[msgs[i].EventID] = now
			a.acked.Add(1)
		}
	}
	return res
}

// startWALPipeline starts an in-process relay (capture wal or table; with an
// ackClock on its publisher) and consumer on a fresh database of dbs, its
// producers writing with Emit in WAL mode.
func (b *bench) startWALPipeline(ctx context.Context, dbs *databases, capture string) (*pipeline, *ackClock, error) {
	pool, url, err := dbs.fresh(ctx, producerConns+4)
	if err != nil {
		return nil, nil, err
	}
	if err := seedOrders(ctx, pool); err != nil {
		pool.Close()
		return nil, nil, err
	}
	stream, prefix, err := b.nats.stream(ctx)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	p := &pipeline{b: b, pool: pool, url: url, stream: stream, prefix: prefix, failed: make(chan error, 4), mode: "in-process", emit: capture == relay.CaptureWAL}
	runCtx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var cleanups []func()
	p.stop = func() {
		cancel()
		wg.Wait()
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}
	fail := func(err error) (*pipeline, *ackClock, error) { p.close(); return nil, nil, err }
	var partitions int
	if err := pool.QueryRow(ctx, relayPartitions).Scan(&partitions); err != nil {
		return fail(err)
	}
	rpool, err := openPool(ctx, url, relay.PoolConns(partitions))
	if err != nil {
		return fail(err)
	}
	cleanups = append(cleanups, rpool.Close)
	pub, err := nats.NewPublisher(ctx, nats.Config{URL: b.nats.url, SubjectPrefix: prefix, Stream: stream,
		Logger: logbridge.AtLeast(b.log.With(slog.String("logger", "nats")), slog.LevelError)})
	if err != nil {
		return fail(err)
	}
	cleanups = append(cleanups, func() { _ = pub.Close() })
	clock := newAckClock(pub)
	r, err := relay.New(relay.Config{Pool: rpool, Publisher: clock, Logger: b.log.With(slog.String("logger", "relay")), Capture: capture, WALSlot: walSlot(url)})
	if err != nil {
		return fail(err)
	}
	cpool, err := openPool(ctx, url, pgrelay.DefaultWorkers+consumer.DefaultIngestLoops+2)
	if err != nil {
		return fail(err)
	}
	cleanups = append(cleanups, cpool.Close)
	c, err := consumer.New(consumer.Config{
		Pool: cpool,
		Subscribe: broker.Subscribe(nats.NewSubscriber, nats.Config{URL: b.nats.url, Stream: stream, SubjectPrefix: prefix,
			Durable: "bench", MaxAckPending: 10 * consumer.DefaultFetchBatchSize, MaxPayloadBytes: consumer.DefaultMaxPayloadBytes}),
		StatsInterval: -1, Logger: b.log.With(slog.String("logger", "consumer")), Inbox: pgrelay.InboxConfig{Handler: ledger.Handler{}},
	})
	if err != nil {
		return fail(err)
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := r.Run(runCtx); err != nil || runCtx.Err() == nil {
			p.failed <- fmt.Errorf("relay stopped: %v", err)
		}
	}()
	go func() {
		defer wg.Done()
		if err := c.Run(runCtx); err != nil || runCtx.Err() == nil {
			p.failed <- fmt.Errorf("consumer stopped: %v", err)
		}
	}()
	cleanups = append(cleanups, func() { dropSlot(pool) })
	if capture == relay.CaptureWAL {
		// Events emitted before the slot exists are not in it.
		if _, err := waitUntil(ctx, p.failed, func(context.Context) (bool, error) {
			s, ok := r.WALStatus()
			return ok && s.Reading, nil
		}); err != nil {
			return fail(fmt.Errorf("WAL relay streaming: %w", err))
		}
	}
	if _, err := p.run(ctx, 10, 1, 1, 0, 0); err != nil {
		return fail(fmt.Errorf("warm-up: %w", err))
	}
	return p, clock, nil
}

// dropSlot drops the WAL relay's slot (after its relay stopped), so that it
// pins no WAL for the measurements that follow and its database can be
// dropped, and forgets its history, so that a relay started on the
// database again creates a slot without reporting a gap. The relay's wal
// sender may take a moment to exit (55006).
func dropSlot(pool *pgxpool.Pool) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		_, err := pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = current_database()`)
		if err == nil {
			_, _ = pool.Exec(ctx, `DELETE FROM pgrelay.wal_slot_history`)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// walSlot is a slot name of the database's own (slots are server-wide).
func walSlot(url string) string {
	name := url[strings.LastIndex(url, "/")+1:]
	if i := strings.IndexByte(name, '?'); i >= 0 {
		name = name[:i]
	}
	return min63("slot_" + name)
}

func min63(s string) string {
	if len(s) > 63 {
		return s[:63]
	}
	return s
}

// walLatency runs walLoad events/s for LoadDuration through a pipeline with
// the given capture and records commit→published and commit→ledger.
func (b *bench) walLatency(ctx context.Context, dbs *databases, capture string) error {
	p, clock, err := b.startWALPipeline(ctx, dbs, capture)
	if err != nil {
		return err
	}
	defer p.close()
	events := max(1, int(walLoad*b.cfg.LoadDuration.Seconds()))
	r, err := p.run(ctx, events, 1, producerConns, walLoad, b.cfg.LoadDuration)
	if err != nil {
		return err
	}
	clock.mu.Lock()
	var pub []time.Duration
	for id, at := range clock.at {
		idx, ok := strings.CutPrefix(id, r.prefix)
		if !ok {
			continue
		}
		i, err := strconv.Atoi(idx)
		if err != nil || i < 0 || i >= len(r.commitAt) || r.commitAt[i] == 0 {
			continue
		}
		pub = append(pub, time.Duration(max(0, at-r.commitAt[i])))
	}
	clock.mu.Unlock()
	if len(pub) < r.events {
		return fmt.Errorf("%d of %d events acknowledged by the broker", len(pub), r.events)
	}
	slices.Sort(pub)
	b.sample("wal_pub_"+capture+"_p50", ms(percentile(pub, 50)))
	b.sample("wal_pub_"+capture+"_p99", ms(percentile(pub, 99)))
	b.sample("wal_effect_"+capture+"_p50", ms(percentile(r.latencies, 50)))
	b.sample("wal_effect_"+capture+"_p99", ms(percentile(r.latencies, 99)))
	return nil
}

// walDrain starts one WAL-capture relay on a fresh database, commits a
// backlog of n events emitted in one transaction once it streams, and
// returns the time from that commit until the broker acknowledged the last.
func (b *bench) walDrain(ctx context.Context, dbs *databases, n int) (time.Duration, error) {
	pool, url, err := dbs.fresh(ctx, 4)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	target, err := relayTargets()[b.cfg.Broker](ctx, b)
	if err != nil {
		return 0, err
	}
	defer target.drop()
	rpool, err := openPool(ctx, url, 4)
	if err != nil {
		return 0, err
	}
	defer rpool.Close()
	pub, err := target.newPublisher(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = pub.Close() }()
	var acked atomic.Int64
	counter := &countingPublisher{Publisher: pub, acked: &acked}
	r, err := relay.New(relay.Config{Pool: rpool, Publisher: counter, Logger: b.log.With(slog.String("logger", "relay")), BatchSize: b.cfg.BatchSize,
		Capture: relay.CaptureWAL, NodeID: "bench-wal-relay", WALSlot: walSlot(url)})
	if err != nil {
		return 0, err
	}
	runCtx, stop := context.WithCancel(ctx)
	failed := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := r.Run(runCtx); err != nil {
			failed <- err
		}
	}()
	defer func() { stop(); wg.Wait(); dropSlot(pool) }()
	if _, err := waitUntil(ctx, failed, func(context.Context) (bool, error) {
		s, ok := r.WALStatus()
		return ok && s.Reading, nil
	}); err != nil {
		return 0, fmt.Errorf("WAL relay streaming: %w", err)
	}
	if _, err := pool.Exec(ctx, emitBacklog, "bench-"+randomHex(4)+"-", n); err != nil {
		return 0, fmt.Errorf("emit backlog: %w", err)
	}
	committed := time.Now()
	end, err := waitUntil(ctx, failed, func(context.Context) (bool, error) { return acked.Load() >= int64(n), nil })
	if err != nil {
		return 0, err
	}
	got, err := target.stored(ctx)
	if err != nil {
		return 0, err
	}
	if got != uint64(n) {
		return 0, fmt.Errorf("WAL relay drain: the %s destination holds %d messages for %d events", b.cfg.Broker, got, n)
	}
	return end.Sub(committed), nil
}

// countingPublisher counts the events the broker acknowledged.
type countingPublisher struct {
	broker.Publisher
	acked *atomic.Int64
}

func (c *countingPublisher) Publish(ctx context.Context, msgs []pgrelay.Message) []broker.Result {
	res := c.Publisher.Publish(ctx, msgs)
	for _, r := range res {
		if r.Err == nil {
			c.acked.Add(1)
		}
	}
	return res
}
