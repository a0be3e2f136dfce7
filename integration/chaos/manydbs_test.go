package chaos

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgrelay/pgrelay/internal/db"
	ledgermigrations "github.com/pgrelay/pgrelay/internal/ledger/migrations"
	"github.com/pgrelay/pgrelay/internal/proc"
	"github.com/pgrelay/pgrelay/migrations"
)

// manyDatabases is how many databases TestChaosManyDatabases serves from the
// start (one more is added mid-run); -chaos.databases raises it (the
// fairness target, 100 ms, is stated for 10 on an idle machine).
const manyDatabases = 4

var (
	flagDatabases = flag.Int("chaos.databases", manyDatabases, "TestChaosManyDatabases: databases the relays serve from the start (one more is added mid-run), at least 3")
	flagBurst     = flag.Int("chaos.burst", burstRows, "TestChaosManyDatabases: events inserted into one database in one statement mid-run")
)

const (
	// burstRows are inserted into one database in one statement mid-run
	// (-chaos.burst).
	burstRows = 60000
	// burstP99Bound bounds the other databases' commit → published p99
	// while the burst drains, on a loaded 2-core machine (or more on one
	// loaded further: see its use).
	burstP99Bound = 500 * time.Millisecond
	// baselineWindow is the time before the burst whose commit → published
	// p99 is the machine's own, for comparison.
	baselineWindow = 15 * time.Second
	// trickleRate is each database's producer: transactions (one event
	// each) per second.
	trickleRate = 10
)

// chaosDB is one database of the run: its producer, writing to a topic of
// its own, and its consumer, whose inbox and ledger live in it.
type chaosDB struct {
	name, url, topic string
	pool             *pgxpool.Pool
	prod             *producer
	cons             *service
	stop             context.CancelFunc
	wg               sync.WaitGroup
}

func (d *chaosDB) startProducer(ctx context.Context) {
	pctx, cancel := context.WithCancel(ctx)
	d.stop = cancel
	d.wg.Go(func() { d.prod.run(pctx) })
}

func (d *chaosDB) stopProducer() {
	if d.stop != nil {
		d.stop()
		d.wg.Wait()
		d.stop = nil
	}
}

// TestChaosManyDatabases runs three relay processes serving every database
// of a private PostgreSQL cluster through one --databases-file, a producer
// and a consumer (inbox and ledger in that database) per database, on one
// NATS stream (a subject per database). Mid-run: one database receives a
// burst of 60,000 events in one statement while the others' commit →
// published p99 is measured (printed, bounded); a relay is SIGKILLed and
// restarted; a database is added to the file and the relays sent SIGHUP (all three take
// its partitions, its events are applied once); one is removed the same way
// once its producer stopped and its outbox drained: its partitions are
// released and an event written afterwards stays pending (a removed database
// is served by nobody; the probe is then deleted). The suite's checker then
// proves, database by database, every event applied exactly once or dead
// with a reason, in per-key order, nothing left behind.
func TestChaosManyDatabases(t *testing.T) {
	if _, err := os.Stat(pgBinDir + "/initdb"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("chaos: needs PostgreSQL server binaries in %s: %v", pgBinDir, err)
		}
		t.Skipf("chaos: needs PostgreSQL server binaries in %s", pgBinDir)
	}
	n := *flagDatabases
	if n < 3 {
		t.Fatalf("-chaos.databases must be at least 3 (one bursts, one is removed, one trickles), got %d", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute+time.Duration(*flagBurst)*2*time.Millisecond)
	defer cancel()
	seed := *flagSeed
	if seed == 0 {
		seed = rand.Uint64N(1<<31) + 2
	}
	work := *flagWorkDir
	if work == "" {
		var err error
		if work, err = os.MkdirTemp("", "pgrelay-chaos-dbs-"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if !t.Failed() {
				_ = os.RemoveAll(work)
			}
		})
	}
	r := &run{cfg: Config{Seed: seed}.WithDefaults(), out: testWriter{t}, started: time.Now(), work: work}
	r.say("many databases: %d served from the start, one added and one removed mid-run; seed %d (rerun: -run TestChaosManyDatabases -chaos.seed=%d); work dir %s",
		n, seed, seed, work)
	bin := binaries(t)
	must := func(err error, what string) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v (logs in %s)", what, err, work)
		}
	}

	pg, err := startPostgres(ctx, filepath.Join(work, "pg"), fmt.Sprintf("max_connections = %d\n", 100+80*(n+1)))
	must(err, "start PostgreSQL")
	defer pg.stop()
	broker, err := startNATSEnv(ctx, work)
	must(err, "start NATS")
	defer broker.close()
	dbs, err := createDatabases(ctx, pg.addr(), n+1)
	must(err, "create the databases")
	defer func() {
		for _, d := range dbs {
			d.stopProducer()
			d.pool.Close()
		}
	}()
	added, removed, burst := dbs[n], dbs[n-1], dbs[0]
	file := filepath.Join(work, "databases")
	must(writeDatabasesFile(file, dbs[:n]), "write the databases file")

	// Three relays over the file, a consumer per database (the one added
	// later idles until then).
	relayEnv, consumerEnv := broker.serviceEnv(broker.upstream())
	common := []string{"LOG_LEVEL=info", "LOG_FORMAT=json", "ADMIN_ADDR=", "METRICS_ADDR="}
	var relays, svcs []*service
	for i := range 3 {
		name := fmt.Sprintf("relay-%d", i+1)
		env := append(append(slices.Clone(common), relayEnv...), "DATABASE_URL=", "RELAY_DATABASES_FILE="+file,
			fmt.Sprintf("RELAY_MAX_CONNS_TOTAL=%d", 40*(n+1)+100), "RELAY_NODE_ID="+name,
			"RELAY_LEASE=3s", "RELAY_HEARTBEAT=1s", "RELAY_PUBLISH_TIMEOUT=10s", "RELAY_BATCH_SIZE=100", "RELAY_POLL_INTERVAL=500ms")
		s := &service{name: name, proc: proc.New(name, filepath.Join(bin, "relay"), []string{"run"}, env, filepath.Join(work, name+".log"))}
		relays, svcs = append(relays, s), append(svcs, s)
	}
	for _, d := range dbs {
		name := "consumer-" + d.name
		env := append(append(slices.Clone(common), consumerEnv...), "DATABASE_URL="+d.url,
			"CONSUMER_DURABLE="+durable+"-"+d.name, "CONSUMER_FILTER_SUBJECT="+subjectPrefix+"."+d.topic,
			"CONSUMER_MAX_WAIT=200ms", "CONSUMER_BATCH_SIZE=100", "CONSUMER_LEASE=4s", "CONSUMER_HANDLER_TIMEOUT=2s",
			"CONSUMER_MAX_ATTEMPTS=50", "CONSUMER_STATS_INTERVAL=10s", "CONSUMER_MAX_PAYLOAD_BYTES=65536")
		d.cons = &service{name: name, proc: proc.New(name, filepath.Join(bin, "consumer"), []string{"run"}, env, filepath.Join(work, name+".log"))}
		svcs = append(svcs, d.cons)
	}
	for _, s := range svcs {
		must(s.start(), "start "+s.name)
	}
	defer func() {
		for _, s := range svcs {
			_ = s.proc.Stop(20 * time.Second)
		}
	}()
	r.say("started %d relays over %s and %d consumers", len(relays), file, len(dbs))
	for i, d := range dbs {
		d.prod = newProducer(d.pool, seed+uint64(i), trickleRate, r.say)
		d.prod.topic = d.topic
	}
	// The producers start once the relays serve every database: the start
	// is not what the baseline measures.
	must(waitFor(ctx, 2*time.Minute, func(ctx context.Context) (bool, error) {
		for _, d := range dbs[:n] {
			if _, owned, err := partitionOwners(ctx, d.pool); err != nil || owned < 16 {
				return false, err
			}
		}
		return true, nil
	}), "the relays hold every database's partitions")
	for _, d := range dbs[:n] {
		d.startProducer(ctx)
	}
	sighup := func() {
		for _, s := range relays {
			must(s.proc.Signal(syscall.SIGHUP), "SIGHUP "+s.name)
		}
	}

	// The burst, and the others' commit → published while it drains.
	// After a baseline (baselineWindow) with every relay settled.
	must(sleepCtx(ctx, baselineWindow+2*time.Second), "run")
	b, err := measureBurst(ctx, r, burst, dbs[1:n])
	must(err, "burst")
	// Under faults on a shared machine the others' p99 is set by the load
	// (0.2-1.5 s here before any burst), so the figure is printed against
	// the target and only starvation fails the run: no database's events
	// wait until the backlog is through (the drain, plus the p99 the machine
	// showed before the burst). The fair share itself is asserted where the
	// load does not dominate: relay's TestFairShareAcrossDatabases and
	// TestGateSharesEventsInFlight.
	p99, limit := quantile(b.p99, 0.99), max(burstP99Bound, b.drain+2*b.p99Before)
	load, _ := os.ReadFile("/proc/loadavg")
	r.say("while %s's burst drained (%s), the %d other databases' %d events: commit → published p99 %s (bound %s; %s before the burst: p99 %s; target 100 ms idle with 10 databases; load average %s)",
		burst.name, b.drain.Round(time.Millisecond), n-1, b.events, p99.Round(time.Millisecond), limit.Round(time.Millisecond),
		baselineWindow, b.p99Before.Round(time.Millisecond), strings.TrimSpace(string(load)))
	if p99 > limit {
		t.Errorf("the other databases' commit → published p99 %s while %s drained %d events in %s, over %s", p99, burst.name, *flagBurst, b.drain, limit)
	}

	// A relay dies; its partitions of every database move to the others.
	relays[1].proc.Kill()
	must(sleepCtx(ctx, 2*time.Second), "run")
	must(relays[1].start(), "restart relay-2")
	// Until it serves every database again (and handles SIGHUP).
	must(waitFor(ctx, 2*time.Minute, func(ctx context.Context) (bool, error) {
		for _, d := range dbs[:n] {
			var held int
			err := d.pool.QueryRow(ctx, `SELECT count(*) FROM pgrelay.relay_partitions
				WHERE owner = $1 AND lease_until > now()`, relays[1].name).Scan(&held)
			if err != nil || held == 0 {
				return false, err
			}
		}
		return true, nil
	}), "relay-2 serves every database again")
	r.say("SIGKILL relay-2, restarted after 2s; it holds partitions of every database again")

	// A database added: every relay takes a share of its partitions, and
	// its events flow from then on.
	must(writeDatabasesFile(file, dbs), "write the databases file")
	sighup()
	added.startProducer(ctx)
	must(waitFor(ctx, 30*time.Second, func(ctx context.Context) (bool, error) {
		owners, owned, err := partitionOwners(ctx, added.pool)
		return owners == len(relays) && owned == 16, err
	}), "the added database's partitions spread over the three relays")
	r.say("%s added to the file, SIGHUP: the three relays hold its 16 partitions", added.name)

	// A database removed once its producer stopped and its outbox drained:
	// nobody serves it any more.
	// Drained for a second on end: the producer's last transaction, its
	// context cancelled while its COMMIT was on the wire, can still commit
	// after the producer returned (a row then appeared pending after the
	// removal, served by nobody, and the drain below never ended).
	removed.stopProducer()
	var drainedSince time.Time
	must(waitFor(ctx, time.Minute, func(ctx context.Context) (bool, error) {
		p, err := db.New().ChaosProgress(ctx, removed.pool)
		if err != nil || p.OutboxPending != 0 {
			drainedSince = time.Time{}
			return false, err
		}
		if drainedSince.IsZero() {
			drainedSince = time.Now()
		}
		return time.Since(drainedSince) >= time.Second, nil
	}), removed.name+"'s outbox drained before its removal")
	must(writeDatabasesFile(file, slices.DeleteFunc(slices.Clone(dbs), func(d *chaosDB) bool { return d == removed })), "write the databases file")
	sighup()
	must(waitFor(ctx, 10*time.Second, func(ctx context.Context) (bool, error) {
		_, owned, err := partitionOwners(ctx, removed.pool)
		return owned == 0, err
	}), removed.name+"'s leases released after its removal")
	must(probeUnserved(ctx, removed), "a removed database is served by nobody")
	r.say("%s removed from the file, SIGHUP: its leases released, an event written afterwards stayed pending 3s (probe deleted)", removed.name)

	// The others go on a little, then everything drains.
	must(sleepCtx(ctx, 5*time.Second), "run")
	for _, d := range dbs {
		d.stopProducer()
	}
	must(drainAll(ctx, r, broker.js, dbs, relays), "drain")
	for _, s := range svcs {
		if err := s.proc.Stop(30 * time.Second); err != nil {
			r.say("%s: %v", s.name, err)
		}
	}
	r.say("services stopped with SIGTERM; checking each database")

	cctx, ccancel := context.WithTimeout(ctx, 2*time.Minute)
	defer ccancel()
	stream, err := broker.readLog(cctx)
	must(err, "read the stream")
	for _, d := range dbs {
		subject := subjectPrefix + "." + d.topic
		var mine []streamMsg
		for _, m := range stream {
			if m.subject == subject {
				mine = append(mine, m)
			}
		}
		rep, err := check(cctx, checkInput{
			pool: d.pool, readLog: func(context.Context) ([]streamMsg, error) { return mine, nil },
			injected: map[string]expectation{}, acknowledged: d.prod.acknowledged(),
		})
		must(err, "check "+d.name)
		r.say("%s: %d events produced (%d delayed), %d in the stream (%d duplicates absorbed), %d processed, %d dead, %d credits, %d violations",
			d.name, rep.Produced, rep.Delayed, rep.StreamMessages, rep.DuplicatesAbsorbed, rep.Processed, rep.Dead, rep.Credits, len(rep.Violations))
		for i, v := range rep.Violations {
			if i == 20 {
				t.Errorf("%s: ... and %d more violations", d.name, len(rep.Violations)-20)
				break
			}
			t.Errorf("%s: %s", d.name, v)
		}
		if rep.Produced == 0 || rep.Credits == 0 {
			t.Errorf("%s proved nothing: %d events, %d credits", d.name, rep.Produced, rep.Credits)
		}
		if d == burst && rep.Produced < *flagBurst {
			t.Errorf("%s: %d events, fewer than its burst of %d", d.name, rep.Produced, *flagBurst)
		}
	}
	if t.Failed() {
		t.Logf("logs in %s", work)
	}
}

// createDatabases creates n databases db1..dbn on the cluster at addr, each
// a copy of one migrated with pgrelay's and the example ledger's migrations.
func createDatabases(ctx context.Context, addr string, n int) ([]*chaosDB, error) {
	url := func(name string) string {
		return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable&connect_timeout=5", addr, name)
	}
	admin, err := pgxpool.New(ctx, url("postgres"))
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	if _, err := admin.Exec(ctx, `CREATE DATABASE template_chaos`); err != nil {
		return nil, err
	}
	tmpl, err := pgxpool.New(ctx, url("template_chaos"))
	if err != nil {
		return nil, err
	}
	sqlDB := stdlib.OpenDBFromPool(tmpl)
	err = migrations.Up(ctx, sqlDB)
	if err == nil {
		err = ledgermigrations.Up(ctx, sqlDB)
	}
	sqlDB.Close()
	tmpl.Close()
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	var dbs []*chaosDB
	for i := range n {
		name := fmt.Sprintf("db%d", i+1)
		// The template's last connection may still be closing.
		err := waitFor(ctx, 10*time.Second, func(ctx context.Context) (bool, error) {
			_, err := admin.Exec(ctx, `CREATE DATABASE `+name+` TEMPLATE template_chaos`)
			return err == nil, nil
		})
		if err != nil {
			return dbs, fmt.Errorf("create database %s: %w", name, err)
		}
		pool, err := pgxpool.New(ctx, url(name)+"&pool_max_conns=4")
		if err != nil {
			return dbs, err
		}
		dbs = append(dbs, &chaosDB{name: name, url: url(name), topic: "orders_" + name, pool: pool})
	}
	return dbs, nil
}

// writeDatabasesFile writes the relays' --databases-file whole, then renames
// it into place: a relay reading it on SIGHUP never sees half of it.
func writeDatabasesFile(path string, dbs []*chaosDB) error {
	var b strings.Builder
	b.WriteString("# TestChaosManyDatabases: the databases the relays serve\n")
	for _, d := range dbs {
		fmt.Fprintf(&b, "%s=%s\n", d.name, d.url)
	}
	if err := os.WriteFile(path+".tmp", []byte(b.String()), 0o600); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}

// waitFor polls done every 100ms until it reports true, fails, or timeout
// passes.
func waitFor(ctx context.Context, timeout time.Duration, done func(context.Context) (bool, error)) error {
	return pollEvery(ctx, 100*time.Millisecond, timeout, done)
}

// pollEvery polls done every interval until it reports true, fails, or
// timeout passes.
func pollEvery(ctx context.Context, interval, timeout time.Duration, done func(context.Context) (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ok, err := done(qctx)
		cancel()
		switch {
		case err != nil:
			return err
		case ok:
			return nil
		case time.Now().After(deadline):
			return fmt.Errorf("not within %s", timeout)
		}
		if err := sleepCtx(ctx, interval); err != nil {
			return err
		}
	}
}

// partitionOwners returns how many relays hold a live lease in the database,
// and on how many partitions.
func partitionOwners(ctx context.Context, pool *pgxpool.Pool) (owners, owned int, err error) {
	err = pool.QueryRow(ctx, `SELECT count(DISTINCT owner), count(owner)
		FROM pgrelay.relay_partitions WHERE owner IS NOT NULL AND lease_until > now()`).Scan(&owners, &owned)
	return owners, owned, err
}

// measureBurst inserts -chaos.burst OrderCreated events into d in one
// statement, waits until they are all published and each of others has
// published what it committed meanwhile, and returns the others' commit →
// published p99 over that time (events without a not_before).
func measureBurst(ctx context.Context, r *run, d *chaosDB, others []*chaosDB) (burstResult, error) {
	began := time.Now()
	var before time.Time
	if err := d.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&before); err != nil {
		return burstResult{}, err
	}
	// A thousand keys: one transaction takes one advisory lock per key it
	// writes, and PostgreSQL's lock table (max_locks_per_transaction per
	// connection) does not hold 100,000.
	_, err := d.pool.Exec(ctx, `INSERT INTO pgrelay.outbox (event_id, topic, key, event_type, payload)
		SELECT 'burst-' || g, $1, 'burst-' || (g % 1000), 'OrderCreated',
		       convert_to(json_build_object('order_id', 'burst-' || g, 'customer_id', 'c' || (g % 200),
		                                    'amount_cents', 100 + g, 'currency', 'EUR')::text, 'UTF8')
		FROM generate_series(1, $2::int) AS g`, d.topic, *flagBurst)
	if err != nil {
		return burstResult{}, err
	}
	// The window starts at the commit (the database's clock): before it,
	// no relay could see a row of the burst.
	var from time.Time
	if err := d.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&from); err != nil {
		return burstResult{}, err
	}
	r.say("%s: %d events committed in one statement (%s)", d.name, *flagBurst, time.Since(began).Round(time.Millisecond))
	var to time.Time
	if err := waitFor(ctx, 2*time.Minute, func(ctx context.Context) (bool, error) {
		var pending int
		var last *time.Time
		err := d.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'pending'), max(published_at)
			FROM pgrelay.outbox WHERE event_id LIKE 'burst-%'`).Scan(&pending, &last)
		if err == nil && pending == 0 && last != nil {
			to = *last
		}
		return !to.IsZero(), err
	}); err != nil {
		return burstResult{}, fmt.Errorf("%s's burst published: %w", d.name, err)
	}
	r.say("%s: the burst published %s after its commit", d.name, to.Sub(from).Round(time.Millisecond))
	res := burstResult{drain: to.Sub(from)}
	var baseline []time.Duration
	for _, o := range others {
		if err := waitFor(ctx, 30*time.Second, func(ctx context.Context) (bool, error) {
			var pending int
			err := o.pool.QueryRow(ctx, `SELECT count(*) FROM pgrelay.outbox
				WHERE status = 'pending' AND not_before IS NULL AND created_at <= $1`, to).Scan(&pending)
			return pending == 0, err
		}); err != nil {
			return res, fmt.Errorf("%s published what it committed during the burst: %w", o.name, err)
		}
		during, err := latencies(ctx, o.pool, from, to)
		if err != nil {
			return res, err
		}
		// The 15 s before the burst's statement began: the machine's own.
		quiet, err := latencies(ctx, o.pool, before.Add(-baselineWindow), before)
		if err != nil {
			return res, err
		}
		r.say("%s: %d events committed during the burst, commit → published p50 %s, p99 %s, max %s (in the %s before it: %d events, p99 %s)", o.name, len(during),
			quantile(during, 0.5).Round(time.Millisecond), quantile(during, 0.99).Round(time.Millisecond), quantile(during, 1).Round(time.Millisecond),
			baselineWindow, len(quiet), quantile(quiet, 0.99).Round(time.Millisecond))
		res.events += len(during)
		res.p99 = append(res.p99, during...)
		baseline = append(baseline, quiet...)
	}
	if res.events < 10*len(others) {
		return res, fmt.Errorf("only %d events committed into the other databases during the burst: too few to measure", res.events)
	}
	res.p99Before = quantile(baseline, 0.99)
	return res, nil
}

// burstResult is what measureBurst measured: from the burst's commit until
// its last event was published (drain), the other databases' events
// committed meanwhile and their commit → published latencies, and their
// p99 over the baselineWindow before the burst's statement began.
type burstResult struct {
	drain     time.Duration
	events    int
	p99       []time.Duration
	p99Before time.Duration
}

// latencies returns the commit → published times of the events committed
// into pool between from and to, but those that wait on purpose: delayed
// ones, and those held behind a delayed event of their key (the producer
// delays one order in eight by up to 1.5 s, and the order's OrderPaid waits
// for its OrderCreated).
func latencies(ctx context.Context, pool *pgxpool.Pool, from, to time.Time) ([]time.Duration, error) {
	rows, err := pool.Query(ctx, `SELECT extract(epoch FROM o.published_at - o.created_at)::float8 FROM pgrelay.outbox o
		WHERE o.status = 'published' AND o.not_before IS NULL AND o.created_at BETWEEN $1 AND $2
		  AND NOT EXISTS (SELECT 1 FROM pgrelay.outbox d
		                  WHERE d.topic = o.topic AND d.key = o.key AND d.id < o.id AND d.not_before IS NOT NULL)`, from, to)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []time.Duration
	for rows.Next() {
		var s float64
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, time.Duration(s*float64(time.Second)))
	}
	return out, rows.Err()
}

// quantile returns the q-quantile of ds (nearest rank); 0 for none.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// probeUnserved writes an event into a database no relay serves, checks it
// is still pending 3s later (5 poll intervals), and deletes it.
func probeUnserved(ctx context.Context, d *chaosDB) error {
	if _, err := d.pool.Exec(ctx, `INSERT INTO pgrelay.outbox (event_id, topic, key, event_type, payload)
		VALUES ('probe-removed', $1, 'probe', 'OrderCreated', '{}')`, d.topic); err != nil {
		return err
	}
	if err := sleepCtx(ctx, 3*time.Second); err != nil {
		return err
	}
	var status string
	if err := d.pool.QueryRow(ctx, `DELETE FROM pgrelay.outbox WHERE event_id = 'probe-removed' RETURNING status`).Scan(&status); err != nil {
		return err
	}
	if status != "pending" {
		return fmt.Errorf("an event written after %s's removal is %s", d.name, status)
	}
	return nil
}

// drainAll waits until every database's outbox is published, its inbox
// settled and its durable consumer has nothing outstanding, twice in a row.
func drainAll(ctx context.Context, r *run, js jetstream.JetStream, dbs []*chaosDB, relays []*service) error {
	services := slices.Clone(relays)
	for _, d := range dbs {
		services = append(services, d.cons)
	}
	stable := 0
	start, lastLog := time.Now(), time.Time{}
	return pollEvery(ctx, time.Second, 3*time.Minute, func(ctx context.Context) (bool, error) {
		var open []string
		for _, d := range dbs {
			p, err := db.New().ChaosProgress(ctx, d.pool)
			if err != nil {
				return false, nil // polled again
			}
			c, err := js.Consumer(ctx, streamName, durable+"-"+d.name)
			var pending, unacked uint64
			if err == nil {
				var ci *jetstream.ConsumerInfo
				if ci, err = c.Info(ctx); err == nil {
					pending, unacked = ci.NumPending, uint64(ci.NumAckPending)
				}
			}
			if errors.Is(err, jetstream.ErrConsumerNotFound) || err == nil && (p.OutboxPending > 0 || p.InboxOpen > 0 || p.InboxTotal < p.OutboxTotal || pending+unacked > 0) {
				open = append(open, fmt.Sprintf("%s: outbox %d pending of %d, inbox %d rows %d open, stream %d pending %d unacked",
					d.name, p.OutboxPending, p.OutboxTotal, p.InboxTotal, p.InboxOpen, pending, unacked))
			} else if err != nil {
				return false, nil
			}
		}
		if len(open) == 0 {
			stable++
		} else {
			stable = 0
		}
		if time.Since(lastLog) > 5*time.Second && len(open) > 0 {
			lastLog = time.Now()
			r.say("drain: %s", strings.Join(open, " | "))
		}
		for _, s := range services {
			if !s.proc.Running() {
				return false, fmt.Errorf("%s exited: %s", s.name, s.proc.Output())
			}
		}
		if stable >= 2 {
			r.say("drained in %s", time.Since(start).Round(time.Millisecond))
		}
		return stable >= 2, nil
	})
}
