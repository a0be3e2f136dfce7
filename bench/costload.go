package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/testcluster"
	"github.com/pgrelay/pgrelay/relay"
)

// The cost group: what an event costs the machine at the loads real services
// run at. The relay and consumer binaries (default settings) run on a private
// cluster (wal_level = logical, track_commit_timestamp = on, fsync off, so
// that no other database's work lands in its processes) and a private
// nats-server process; the producer is the benchmark itself, one event per
// transaction (pgrelay.Enqueue for the table outbox, pgrelay.Emit for WAL
// capture), on its own pool whose backends are excluded.
//
// CPU is read from /proc (utime + stime) at a window's start and end only:
// the relay and consumer processes, nats-server, and the PostgreSQL backends
// serving the relay and the consumer: every backend of the run's database
// (its WAL sender included) except the benchmark's own, found with one
// pg_stat_activity query at each end of the window. A backend that appears
// in the window counts in full; one that exits in it is lost (counted and
// printed). Nothing polls the database while a window is open: an event's
// effect time is its ledger credit's commit timestamp, read once after the
// window closed and the run drained.

// costLoads are the fixed offered loads of the group, events/s.
var costLoads = []int{500, 2_000, 5_000}

// costWarm is how long a fixed load runs before its window opens.
const costWarm = 2 * time.Second

// costIdle is the idle window.
const costIdle = 10 * time.Second

// benchAppName marks the benchmark's own connections (producers, control),
// whose backends are not the relay's or the consumer's.
const benchAppName = "pgrelay-bench"

// costModes are the pipelines the cost group measures: the relay and the
// consumer with the table outbox, with WAL capture, and the minimal
// pipeline (bench/minimal.go), the floor of both.
var costModes = []string{relay.CaptureTable, relay.CaptureWAL, captureMinimal}

// costComponents are the measured components, in report order; their sum is
// the total the targets name.
var costComponents = []string{"relay", "consumer", "pg", "nats"}

func (b *bench) costLoads() []int {
	switch {
	case len(b.cfg.CostLoads) > 0:
		return b.cfg.CostLoads
	case b.cfg.Quick:
		return []int{200}
	}
	return costLoads
}

// costStatements lists the run's statements of the last load
// (pg_stat_statements, reset before it): sqlc's "-- name:" comment or the
// statement's start, calls and execution time per event.
const costStatements = `SELECT coalesce(substring(query from '^-- name: (\S+)'), left(regexp_replace(query, '\s+', ' ', 'g'), 70)), sum(calls)::bigint, sum(total_exec_time)::float8
FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
GROUP BY 1 ORDER BY 3 DESC LIMIT 20`

func (p *costPipeline) printStatements(ctx context.Context, out *os.File, events int) error {
	rows, err := p.pool.Query(ctx, costStatements)
	if err != nil {
		return fmt.Errorf("pg_stat_statements: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var calls int64
		var total float64
		if err := rows.Scan(&name, &calls, &total); err != nil {
			return err
		}
		fmt.Fprintf(out, "    %-70s calls/event %6.3f  exec ms/event %.4f\n", name, float64(calls)/float64(max(1, events)), total/float64(max(1, events)))
	}
	return rows.Err()
}

// declareCostFigures adds the cost group's figures.
func (b *bench) declareCostFigures(add func(id, group, name, unit, mode, floor string, target *Target, note string)) {
	ratio := func(v float64, text string) *Target { return &Target{Kind: "ratio>=", Value: v, Text: text} }
	atMost := func(v float64, text string) *Target { return &Target{Kind: "<=", Value: v, Text: text} }
	atLeast := func(v float64, text string) *Target { return &Target{Kind: ">=", Value: v, Text: text} }
	names := map[string]string{"relay": "relay", "consumer": "consumer", "pg": "PostgreSQL backends of relay+consumer", "nats": "nats-server"}
	add("cost_floor_one", "cost", "combined floor, 1/tx (private cluster)", unitRate, "sql", "", nil, "")
	for _, m := range costModes {
		// The minimal pipeline (the floor) has no idle figure (it polls
		// without pause) and no target.
		label, note, target := m+" capture", "", func(t *Target) *Target { return t }
		if m == captureMinimal {
			label, note = "minimal pipeline (floor)", "bench/minimal.go: the same hops with the fewest round trips and no guarantee (no leases, fencing, order, retries; marked before published)"
			target = func(*Target) *Target { return nil }
		} else {
			for _, c := range costComponents {
				add("cost_"+m+"_idle_"+c, "cost", m+" capture, idle: "+names[c], "cpu-s/s", "process", "", nil, "")
			}
			add("cost_"+m+"_idle_total", "cost", m+" capture, idle: total", "cpu-s/s", "process", "", nil, "")
		}
		for _, l := range b.costLoads() {
			ls := itoa(l)
			pre := "cost_" + m + "_" + ls
			for _, c := range costComponents {
				add(pre+"_"+c, "cost", "  "+m+" "+ls+"/s: "+names[c], unitCPUEvent, "process", "", nil, "")
			}
			var tot, p50, p99, ach *Target
			switch {
			case l == 500:
				tot, p50, p99 = atMost(0.6, "≤ 0.6 cpu-ms"), atMost(5, "p50 ≤ 5 ms"), atMost(20, "p99 ≤ 20 ms")
			case l == 2000:
				tot = atMost(0.5, "≤ 0.5 cpu-ms")
			case l == 5000 && m == relay.CaptureWAL:
				ach = atLeast(3500, "≥ 3,500/s")
			}
			// The ratio printed beside a total is to the minimal pipeline's
			// at the same load: what the guarantees cost over the hops.
			floor := "cost_" + captureMinimal + "_" + ls + "_total"
			if m == captureMinimal {
				floor = ""
			}
			add(pre+"_total", "cost", label+", "+ls+"/s offered, 1/tx: total CPU per event", unitCPUEvent, "process", floor, target(tot), note)
			add(pre+"_producer", "cost", "  (not in total) the producer's backends", unitCPUEvent, "process", "", nil, "")
			add(pre+"_achieved", "cost", "  reached (credited in the window)", unitRate, "process", "", target(ach), "")
			add(pre+"_p50", "cost", "  commit→credit p50", unitMs, "process", "", target(p50), "")
			add(pre+"_p99", "cost", "  commit→credit p99", unitMs, "process", "", target(p99), "")
		}
		t := ratio(0.4, "≥ 0.4× 1-event floor")
		if m == relay.CaptureWAL {
			t = ratio(0.6, "≥ 0.6× 1-event floor")
		}
		add("cost_"+m+"_flat", "cost", label+", end to end flat out, 1/tx", unitRate, "process", "cost_floor_one", target(t), "")
		add("cost_"+m+"_flat_total", "cost", "  total CPU per event flat out", unitCPUEvent, "process", "", nil, "")
	}
	add("rss_relay", "cost", "relay peak RSS (VmHWM)", unitMiB, "process", "", atMost(100, "≤ 100 MiB"), "")
	add("rss_consumer", "cost", "consumer peak RSS (VmHWM)", unitMiB, "process", "", atMost(100, "≤ 100 MiB"), "")
}

// costEnv is the group's private cluster and nats-server.
type costEnv struct {
	cluster *testcluster.Cluster
	dbs     *databases
	nats    *natsEnv
	natsPID int
	natsP   *process
	natsDir string
}

func (e *costEnv) close() {
	if e.nats != nil {
		e.nats.close()
	}
	if e.natsP != nil {
		e.natsP.stop()
	}
	if e.natsDir != "" {
		os.RemoveAll(e.natsDir)
	}
	if e.dbs != nil {
		e.dbs.dropAll()
	}
	if e.cluster != nil {
		e.cluster.Remove()
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (b *bench) startCostEnv(ctx context.Context) (*costEnv, error) {
	e := &costEnv{}
	var err error
	conf := walClusterConf + "\ntrack_commit_timestamp = on"
	if b.cfg.CostStatements {
		conf += "\nshared_preload_libraries = 'pg_stat_statements'\npg_stat_statements.track = 'all'"
	}
	e.cluster, err = testcluster.New(ctx, conf)
	if err != nil {
		e.close()
		return nil, fmt.Errorf("private cluster: %w", err)
	}
	if e.dbs, err = newDatabases(ctx, e.cluster.URL(), b.log); err != nil {
		e.close()
		return nil, fmt.Errorf("private cluster databases: %w", err)
	}
	if e.dbs.postmaster == 0 {
		e.close()
		return nil, fmt.Errorf("private cluster: %s", e.dbs.postmasterErr)
	}
	port, err := freePort()
	if err != nil {
		e.close()
		return nil, err
	}
	if e.natsDir, err = os.MkdirTemp("", "pgrelay-bench-nats-"); err != nil {
		e.close()
		return nil, err
	}
	bin := os.Getenv("BENCH_NATS_SERVER")
	if bin == "" {
		bin = "nats-server"
	}
	e.natsP, err = startProcess("nats-server", bin, []string{"-js", "-a", "127.0.0.1", "-p", strconv.Itoa(port), "-sd", e.natsDir}, nil)
	if err != nil {
		e.close()
		return nil, fmt.Errorf("private nats-server (BENCH_NATS_SERVER): %w", err)
	}
	url := "nats://127.0.0.1:" + strconv.Itoa(port)
	for i := 0; ; i++ {
		if e.nats, err = startNATS(ctx, url, b.log); err == nil {
			break
		}
		if i == 100 {
			e.close()
			return nil, err
		}
		time.Sleep(100 * time.Millisecond)
	}
	e.natsPID = e.natsP.Pid()
	return e, nil
}

// costPipeline is the relay and consumer processes over one database.
type costPipeline struct {
	env     *costEnv
	capture string
	pool    *pgxpool.Pool // the producers' and control pool (benchAppName)
	db      string
	stream  string
	procs   map[string]*process
	failed  chan error
}

func (p *costPipeline) close() {
	for _, pr := range p.procs {
		pr.stop()
	}
	if p.capture == relay.CaptureWAL && p.pool != nil {
		dropSlot(p.pool)
	}
	if p.stream != "" {
		p.env.nats.dropStream(p.stream)
	}
	if p.pool != nil {
		p.pool.Close()
	}
}

func withAppName(url, name string) string {
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + "application_name=" + name
}

func (b *bench) startCostPipeline(ctx context.Context, env *costEnv, capture string) (*costPipeline, error) {
	pool0, url, err := env.dbs.fresh(ctx, 1)
	if err != nil {
		return nil, err
	}
	pool0.Close()
	p := &costPipeline{env: env, capture: capture, procs: map[string]*process{}, failed: make(chan error, 4)}
	cfg, err := pgxpool.ParseConfig(withAppName(url, benchAppName))
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 17
	if p.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return nil, err
	}
	if err := p.pool.QueryRow(ctx, "SELECT current_database()").Scan(&p.db); err != nil {
		p.close()
		return nil, err
	}
	if err := seedOrders(ctx, p.pool); err != nil {
		p.close()
		return nil, err
	}
	// A service in its steady state: tables holding recent finished rows,
	// analyzed, so that no ANALYZE of a young table growing by the load's
	// rows (maintenance.Statistics: 20 % changed) lands in the windows.
	for _, q := range []string{"ALTER TABLE pgrelay.outbox DISABLE TRIGGER USER", costPrefillOutbox, "ALTER TABLE pgrelay.outbox ENABLE TRIGGER USER",
		costPrefillInbox, "VACUUM (ANALYZE) pgrelay.outbox", "VACUUM (ANALYZE) pgrelay.inbox"} {
		var args []any
		if strings.Contains(q, "$1") {
			args = append(args, min(costPrefill, b.cfg.Prefill))
		}
		if _, err := p.pool.Exec(ctx, q, args...); err != nil {
			p.close()
			return nil, fmt.Errorf("prefill: %w", err)
		}
	}
	if b.cfg.CostStatements {
		if _, err := p.pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
			p.close()
			return nil, err
		}
	}
	stream, prefix, err := env.nats.stream(ctx)
	if err != nil {
		p.close()
		return nil, err
	}
	p.stream = stream
	common := []string{"LOG_LEVEL=warn", "LOG_FORMAT=console", "NATS_URL=" + env.nats.url, "METRICS_ADDR=127.0.0.1:0", "ADMIN_ADDR="}
	relayEnv := append(slices.Clone(common), "DATABASE_URL="+withAppName(url, "pgrelay-relay"), "RELAY_STREAM="+stream, "RELAY_SUBJECT_PREFIX="+prefix)
	if capture == relay.CaptureWAL {
		relayEnv = append(relayEnv, "RELAY_CAPTURE=wal", "RELAY_WAL_SLOT="+walSlot(url))
	}
	relayBin, relayArgs, consumerBin, consumerArgs := b.bins.relay, []string{"run"}, b.bins.consumer, []string{"run"}
	if capture == captureMinimal {
		self, err := os.Executable()
		if err != nil {
			p.close()
			return nil, err
		}
		relayBin, relayArgs, consumerBin, consumerArgs = self, []string{minimalRelayCmd}, self, []string{minimalConsumerCmd}
	}
	rp, err := startProcess("relay", relayBin, relayArgs, relayEnv)
	if err != nil {
		p.close()
		return nil, err
	}
	p.procs["relay"] = rp
	cp, err := startProcess("consumer", consumerBin, consumerArgs, append(slices.Clone(common), "DATABASE_URL="+withAppName(url, "pgrelay-consumer"),
		"CONSUMER_STREAM="+stream, "CONSUMER_SUBJECT_PREFIX="+prefix, "CONSUMER_DURABLE=bench", "CONSUMER_HTTP_ADDR=127.0.0.1:0", "CONSUMER_STATS_INTERVAL_SEC=-1"))
	if err != nil {
		p.close()
		return nil, err
	}
	p.procs["consumer"] = cp
	for _, pr := range p.procs {
		go func() {
			<-pr.Done()
			select {
			case p.failed <- pr.Exited():
			default:
			}
		}()
	}
	if capture == relay.CaptureWAL {
		// Events emitted before the slot exists are not in it.
		if _, err := waitUntil(ctx, p.failed, func(ctx context.Context) (bool, error) {
			n, err := count(ctx, p.pool, "SELECT count(*) FROM pg_replication_slots WHERE active AND slot_name = '"+walSlot(url)+"'")
			return n > 0, err
		}); err != nil {
			p.close()
			return nil, fmt.Errorf("WAL relay streaming: %w", err)
		}
	}
	// Warm up: events through the whole chain.
	if _, err := p.load(ctx, 0, 50, 4, 0); err != nil {
		p.close()
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	return p, nil
}

// costPrefill is how many finished rows the outbox and the inbox hold
// before a cost run (at most Config.Prefill): the last hour of a service at
// about 30 events/s.
const costPrefill = 100_000

const costPrefillOutbox = `INSERT INTO pgrelay.outbox (id, event_id, topic, key, partition, event_type, payload, status, attempts, published_at, created_at, occurred_at)
SELECT nextval('pgrelay.outbox_id_seq'), 'done-' || i, 'orders', 'order-' || (i % 1000), pgrelay.outbox_partition('order-' || (i % 1000)), 'OrderPaid',
       convert_to(json_build_object('order_id', 'order-' || (i % 1000), 'amount_cents', 100 + i % 900, 'currency', 'EUR')::text, 'UTF8'),
       'published', 1, t, t, t
FROM generate_series(0, $1::int - 1) AS i,
     LATERAL (SELECT now() - interval '1 hour' + i * interval '30 ms') AS x(t)`

const costPrefillInbox = `INSERT INTO pgrelay.inbox (event_id, topic, key, event_type, payload, status, attempts,
                   lock_version, started_at, finished_at, received_at, occurred_at)
SELECT 'done-' || i, 'orders', 'order-' || (i % 1000), 'OrderPaid',
       convert_to(json_build_object('order_id', 'order-' || (i % 1000), 'amount_cents', 100 + i % 900, 'currency', 'EUR')::text, 'UTF8'),
       'processed', 1, 1, t, t, t, t
FROM generate_series(0, $1::int - 1) AS i,
     LATERAL (SELECT now() - interval '1 hour' + i * interval '30 ms') AS x(t)`

// costCPU is one reading of every component's CPU seconds.
type costCPU struct {
	at       time.Time
	procs    map[string]float64 // relay, consumer, nats
	backends map[int]backendCPU
	pgAll    float64
	xacts    int64 // pg_stat_database.xact_commit of the run's database
}

type backendCPU struct {
	app   string
	secs  float64
	start float64 // seconds after boot
}

const runBackends = `SELECT pid, coalesce(application_name, '') FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`

func (p *costPipeline) readCPU(ctx context.Context) (costCPU, error) {
	r := costCPU{at: time.Now(), procs: map[string]float64{}, backends: map[int]backendCPU{}}
	rows, err := p.pool.Query(ctx, runBackends, p.db)
	if err != nil {
		return r, err
	}
	pids, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (backendCPU, error) {
		var pid int
		var app string
		err := row.Scan(&pid, &app)
		return backendCPU{app: app, start: float64(pid)}, err
	})
	if err != nil {
		return r, err
	}
	for _, bc := range pids {
		pid := int(bc.start)
		st, err := readProcStat(pid)
		if err != nil {
			continue // gone meanwhile
		}
		r.backends[pid] = backendCPU{app: bc.app, secs: st.utime + st.stime, start: st.start}
	}
	// Backends flush their counts about once a second: approximate.
	if err := p.pool.QueryRow(ctx, "SELECT xact_commit FROM pg_stat_database WHERE datname = $1", p.db).Scan(&r.xacts); err != nil {
		return r, err
	}
	for name, pr := range p.procs {
		if r.procs[name], err = pr.cpuSeconds(); err != nil {
			return r, err
		}
	}
	st, err := readProcStat(p.env.natsPID)
	if err != nil {
		return r, err
	}
	r.procs["nats"] = st.utime + st.stime
	if r.pgAll, err = postgresCPU(p.env.dbs.postmaster); err != nil {
		return r, err
	}
	return r, nil
}

// costUse is a window's CPU seconds per component: relay, consumer, nats, pg
// (the relay's and consumer's backends), producer (the benchmark's
// backends), pgrest (the rest of the server: background processes).
type costUse struct {
	secs  map[string]float64
	dur   time.Duration
	lost  int
	xacts int64
	// lostApps are the application names of the backends lost.
	lostApps []string
}

func (to costCPU) since(from costCPU) costUse {
	u := costUse{secs: map[string]float64{}, dur: to.at.Sub(from.at), xacts: to.xacts - from.xacts}
	for name, v := range to.procs {
		u.secs[name] = v - from.procs[name]
	}
	var pg, prod float64
	for pid, e := range to.backends {
		d := e.secs
		if s, ok := from.backends[pid]; ok && s.start == e.start {
			d -= s.secs
		}
		if e.app == benchAppName {
			prod += d
		} else {
			pg += d
		}
	}
	for pid, e := range from.backends {
		if _, ok := to.backends[pid]; !ok {
			u.lost++
			u.lostApps = append(u.lostApps, e.app)
		}
	}
	u.secs["pg"], u.secs["producer"] = pg, prod
	u.secs["pgrest"] = to.pgAll - from.pgAll - pg - prod
	return u
}

func (u costUse) total() float64 {
	var t float64
	for _, c := range costComponents {
		t += u.secs[c]
	}
	return t
}

// loadResult is a fixed-load (or flat-out) run.
type loadResult struct {
	produced  int
	inWindow  int // credits committed inside the window
	window    time.Duration
	use       costUse
	latencies []time.Duration
	first     time.Time
	last      time.Time // the last credit's commit
}

const creditTimes = `SELECT event_id, pg_xact_commit_timestamp(xmin) FROM ledger_entries WHERE starts_with(event_id, $1)`

// load offers rate events/s (0: flat out) one event per transaction from
// producers connections for dur (flat out: n events), with the CPU window
// opening after warm (flat out: at the start) and closing when production
// ends (flat out: at the last credit). It then waits for every credit and
// reads their commit timestamps once.
func (p *costPipeline) load(ctx context.Context, rate int, n, producers int, dur time.Duration) (loadResult, error) {
	var res loadResult
	gen := newGenerator("cost")
	if rate > 0 {
		n = int(float64(rate)*dur.Seconds()) + 1
	}
	commitAt := make([]atomic.Int64, n)
	var committed atomic.Int64
	tickets := make(chan int, 1024)
	start := time.Now()
	res.first = start
	go func() {
		defer close(tickets)
		for i := range n {
			if rate > 0 {
				due := start.Add(time.Duration(float64(i) / float64(rate) * float64(time.Second)))
				if d := time.Until(due); d > 0 {
					select {
					case <-ctx.Done():
						return
					case <-time.After(d):
					}
				}
			}
			select {
			case tickets <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
	var from costCPU
	var fromErr error
	windowOpen := make(chan struct{})
	if rate > 0 {
		go func() {
			defer close(windowOpen)
			select {
			case <-time.After(min(costWarm, dur/4)):
			case <-ctx.Done():
			}
			from, fromErr = p.readCPU(ctx)
		}()
	} else {
		from, fromErr = p.readCPU(ctx)
		close(windowOpen)
	}
	err := fanOut(ctx, producers, func(ctx context.Context, _ int) error {
		msg := make([]pgrelay.Message, 1)
		for i := range tickets {
			e := gen.event(i)
			msg[0] = pgrelay.Message{EventID: e.id, Topic: topic, Key: e.key, EventType: eventType, Payload: e.payload}
			tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err := pgx.BeginFunc(tctx, p.pool, func(tx pgx.Tx) error {
				if p.capture == relay.CaptureWAL {
					return pgrelay.Emit(tctx, tx, msg...)
				}
				return pgrelay.Enqueue(tctx, tx, msg...)
			})
			cancel()
			if err != nil {
				return fmt.Errorf("produce: %w", err)
			}
			commitAt[i].Store(time.Now().UnixNano())
			committed.Add(1)
		}
		return nil
	})
	<-windowOpen
	if err != nil {
		return res, err
	}
	if fromErr != nil {
		return res, fromErr
	}
	var to costCPU
	if rate > 0 {
		if to, err = p.readCPU(ctx); err != nil {
			return res, err
		}
	}
	res.produced = int(committed.Load())
	// Wait for every credit: polls, but outside the window (flat out: the
	// window ends here, within one poll of the last credit).
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		c, err := countPrefix(ctx, p.pool, gen.prefix)
		if err != nil {
			return res, err
		}
		if c >= int64(res.produced) {
			break
		}
		select {
		case <-ctx.Done():
			return res, fmt.Errorf("waiting for %d credits (%d in): %w", res.produced, c, ctx.Err())
		case err := <-p.failed:
			return res, fmt.Errorf("service stopped: %v", err)
		case <-t.C:
		}
	}
	if rate == 0 {
		if to, err = p.readCPU(ctx); err != nil {
			return res, err
		}
	}
	res.use = to.since(from)
	res.window = to.at.Sub(from.at)
	rows, err := p.pool.Query(ctx, creditTimes, gen.prefix)
	if err != nil {
		return res, err
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var ts *time.Time
		if err := rows.Scan(&id, &ts); err != nil {
			return res, err
		}
		i, err := strconv.Atoi(strings.TrimPrefix(id, gen.prefix))
		if err != nil || i < 0 || i >= n || ts == nil {
			return res, fmt.Errorf("credit %q without its commit timestamp", id)
		}
		if ts.After(res.last) {
			res.last = *ts
		}
		if !ts.Before(from.at) && !ts.After(to.at) {
			res.inWindow++
		}
		if c := commitAt[i].Load(); c != 0 {
			res.latencies = append(res.latencies, time.Duration(max(0, ts.UnixNano()-c)))
		}
	}
	if err := rows.Err(); err != nil {
		return res, err
	}
	slices.Sort(res.latencies)
	return res, nil
}

func countPrefix(ctx context.Context, pool *pgxpool.Pool, prefix string) (int64, error) {
	var n int64
	err := pool.QueryRow(ctx, "SELECT count(*) FROM ledger_entries WHERE starts_with(event_id, $1)", prefix).Scan(&n)
	return n, err
}

// runCostGroup measures the cost group (see the top of this file).
func (b *bench) runCostGroup(ctx context.Context) {
	var all []string
	for _, f := range b.res.Figures {
		if f.Group == "cost" {
			all = append(all, f.ID)
		}
	}
	if b.bins == nil {
		b.fail(all, errors.New("needs the relay and consumer binaries: "+fmt.Sprint(b.res.Settings["services"])))
		return
	}
	setup, cancel := context.WithTimeout(ctx, 3*time.Minute)
	env, err := b.startCostEnv(setup)
	cancel()
	if err != nil {
		b.fail(all, err)
		return
	}
	defer env.close()
	b.res.Settings["cost_cluster"] = "private cluster (initdb), " + strings.ReplaceAll(walClusterConf, "\n", ", ") + ", track_commit_timestamp = on, fsync off; private nats-server process"
	out := os.Stderr
	fmt.Fprintf(out, "cost: private cluster %s, nats %s\n", env.dbs.adminURL, env.nats.url)
	for rep := range b.cfg.Repeats {
		// The combined floor on the same cluster, in the same sitting.
		b.attempt(ctx, "cost floor", []string{"cost_floor_one"}, func(ctx context.Context) error {
			if b.cfg.CostNoFloor {
				return errors.New("skipped (-cost-floor=false)")
			}
			saved := b.dbs
			b.dbs = env.dbs
			defer func() { b.dbs = saved }()
			ft, err := b.runFloors(ctx)
			if err != nil {
				return err
			}
			n := b.cfg.Events
			v := rate(n, ft.outboxInsertOne+ft.outboxMarkOne+ft.inboxInsert+ft.inboxProcess)
			b.sample("cost_floor_one", v)
			fmt.Fprintf(out, "cost rep %d: combined floor 1/tx %.0f/s  [load %s]\n", rep+1, v, loadAvg())
			return nil
		})
		for _, m := range costModes {
			if b.cfg.CostCapture != "" && b.cfg.CostCapture != m {
				continue
			}
			var ids []string
			for _, id := range all {
				if strings.HasPrefix(id, "cost_"+m+"_") {
					ids = append(ids, id)
				}
			}
			b.attempt(ctx, "cost, "+m+" capture", ids, func(ctx context.Context) error {
				return b.costRun(ctx, env, m, out)
			})
		}
	}
	b.note("cost_table_idle_total", "CPU-seconds per second over "+costIdle.String()+" with nothing to do; relay, consumer, their PostgreSQL backends, nats-server")
	b.note("cost_table_500_total", fmt.Sprintf("relay + consumer + their PostgreSQL backends + nats-server (private), CPU from /proc over %s of load after %s warm-up (a quarter of shorter runs), per event credited in the window; producer: the benchmark, 1 event/tx, its backends excluded (shown apart); latency: producer's commit to the credit's commit timestamp, read once at the end; load average in the run's log", b.cfg.LoadDuration-costWarm, costWarm))
}

// costRun measures one capture mode: idle, the fixed loads, flat out.
func (b *bench) costRun(ctx context.Context, env *costEnv, m string, out *os.File) error {
	p, err := b.startCostPipeline(ctx, env, m)
	if err != nil {
		return err
	}
	defer p.close()
	if m != captureMinimal { // the minimal relay polls without pause: no idle figure
		if err := b.costIdle(ctx, p, m, out); err != nil {
			return err
		}
	}
	for _, l := range b.costLoads() {
		if b.cfg.CostStatements {
			if _, err := p.pool.Exec(ctx, "SELECT pg_stat_statements_reset()"); err != nil {
				return err
			}
		}
		r, err := p.load(ctx, l, 0, 16, b.cfg.LoadDuration)
		if err != nil {
			return fmt.Errorf("%d/s: %w", l, err)
		}
		pre := "cost_" + m + "_" + itoa(l)
		ev := float64(max(1, r.inWindow))
		per := func(s float64) float64 { return s * 1000 / ev }
		for _, c := range costComponents {
			b.sample(pre+"_"+c, per(r.use.secs[c]))
		}
		b.sample(pre+"_total", per(r.use.total()))
		b.sample(pre+"_producer", per(r.use.secs["producer"]))
		b.sample(pre+"_achieved", ev/r.window.Seconds())
		b.sample(pre+"_p50", ms(percentile(r.latencies, 50)))
		b.sample(pre+"_p99", ms(percentile(r.latencies, 99)))
		fmt.Fprintf(out, "cost %s %d/s: reached %.0f/s; cpu-ms/event relay %.3f consumer %.3f pg %.3f nats %.3f total %.3f (producer backends %.3f, pg rest %.3f); p50 %.2f ms p99 %.2f ms; commits/event %.2f; lost backends %d %v  [load %s]\n",
			m, l, ev/r.window.Seconds(), per(r.use.secs["relay"]), per(r.use.secs["consumer"]), per(r.use.secs["pg"]), per(r.use.secs["nats"]), per(r.use.total()),
			per(r.use.secs["producer"]), per(r.use.secs["pgrest"]), ms(percentile(r.latencies, 50)), ms(percentile(r.latencies, 99)), float64(r.use.xacts)/ev, r.use.lost, r.use.lostApps, loadAvg())
		if b.cfg.CostStatements {
			if err := p.printStatements(ctx, out, r.produced); err != nil {
				return err
			}
		}
	}
	r, err := p.load(ctx, 0, b.cfg.Events, 8, 0)
	if err != nil {
		return fmt.Errorf("flat out: %w", err)
	}
	thr := rate(r.produced, r.last.Sub(r.first))
	b.sample("cost_"+m+"_flat", thr)
	tot := r.use.total() * 1000 / float64(r.produced)
	b.sample("cost_"+m+"_flat_total", tot)
	fmt.Fprintf(out, "cost %s flat out 1/tx: %.0f/s, %.3f cpu-ms/event (relay %.3f consumer %.3f pg %.3f nats %.3f); p50 %.1f ms p99 %.1f ms  [load %s]\n",
		m, thr, tot, r.use.secs["relay"]*1000/float64(r.produced), r.use.secs["consumer"]*1000/float64(r.produced), r.use.secs["pg"]*1000/float64(r.produced), r.use.secs["nats"]*1000/float64(r.produced),
		ms(percentile(r.latencies, 50)), ms(percentile(r.latencies, 99)), loadAvg())
	if m == captureMinimal {
		return nil // the binaries' memory only
	}
	for name, pr := range p.procs {
		if rss, err := pr.peakRSS(); err == nil {
			b.sample("rss_"+name, rss)
		}
	}
	return nil
}

// costIdle measures the pipeline with nothing to do: CPU-seconds per second.
func (b *bench) costIdle(ctx context.Context, p *costPipeline, m string, out *os.File) error {
	idle := costIdle
	if b.cfg.Quick {
		idle = 2 * time.Second
	}
	time.Sleep(idle / 5)
	from, err := p.readCPU(ctx)
	if err != nil {
		return err
	}
	select {
	case <-time.After(idle):
	case <-ctx.Done():
		return ctx.Err()
	case err := <-p.failed:
		return fmt.Errorf("service stopped: %v", err)
	}
	to, err := p.readCPU(ctx)
	if err != nil {
		return err
	}
	u := to.since(from)
	secs := u.dur.Seconds()
	for _, c := range costComponents {
		b.sample("cost_"+m+"_idle_"+c, u.secs[c]/secs)
	}
	b.sample("cost_"+m+"_idle_total", u.total()/secs)
	fmt.Fprintf(out, "cost %s idle: cpu-s/s relay %.4f consumer %.4f pg %.4f nats %.4f total %.4f (pg rest %.4f)  [load %s]\n",
		m, u.secs["relay"]/secs, u.secs["consumer"]/secs, u.secs["pg"]/secs, u.secs["nats"]/secs, u.total()/secs, u.secs["pgrest"]/secs, loadAvg())
	return nil
}
