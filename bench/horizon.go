package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/testcluster"
)

// The horizon group: a steady load through the whole pipeline while a
// REPEATABLE READ transaction in the same database holds the xmin horizon,
// so that no dead tuple can be removed (by vacuum or by an index scan's
// kill) until it ends: the death spiral of SKIP LOCKED queues. It runs on a
// private cluster (internal/testcluster: default settings, autovacuum on,
// pg_stat_statements loaded for the claim times) with the services
// in-process, and samples, every HorizonSample, the backlog, the oldest
// pending row of the outbox and the inbox, their dead tuples and sizes, and
// the mean time of the relay's and the inbox's claim statements.

// horizonSample is one row of the horizon table.
type horizonSample struct {
	at                          time.Duration // since the load started
	phase                       string        // before, hold, after
	produced, applied           int64
	appliedRate                 float64 // events/s since the previous sample
	outboxPending, inboxPending int64
	outboxOldest, inboxOldest   float64 // ms
	outboxDead, inboxDead       int64
	outboxTable, outboxIndexes  int64 // bytes
	inboxTable, inboxIndexes    int64
	inboxClaimMs, relayClaimMs  float64 // mean over the interval; NaN: no call
	inboxClaims, relayClaims    int64
	inboxInsertMs               float64
}

// horizonState reads, in one statement, everything a sample shows from the
// database. The pending counts walk the partial pending indexes from the
// start, every dead entry included, so under a held horizon a sample takes a
// second or more: the oldest rows' ages are taken at the statement's start
// (statement_timestamp, when its snapshot was taken), not when each subquery
// ran (clock_timestamp counted the sample's own time into the lag).
const horizonState = `SELECT
 (SELECT count(*) FROM pgrelay.outbox WHERE status = 'pending'),
 (SELECT greatest(coalesce(extract(epoch FROM statement_timestamp() - min(created_at)) * 1000, 0), 0)::float8 FROM pgrelay.outbox WHERE status = 'pending'),
 (SELECT count(*) FROM pgrelay.inbox WHERE status = 'pending'),
 (SELECT greatest(coalesce(extract(epoch FROM statement_timestamp() - min(received_at)) * 1000, 0), 0)::float8 FROM pgrelay.inbox WHERE status = 'pending'),
 (SELECT count(*) FROM ledger_entries),
 coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE schemaname = 'pgrelay' AND relname = 'outbox'), 0),
 coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE schemaname = 'pgrelay' AND relname = 'inbox'), 0),
 pg_table_size('pgrelay.outbox'), pg_indexes_size('pgrelay.outbox'),
 pg_table_size('pgrelay.inbox'), pg_indexes_size('pgrelay.inbox')`

// horizonStatements reads the cumulative calls and execution time of the
// claims (and the consumer's store) from pg_stat_statements; sqlc's leading
// "-- name:" comment names each statement.
const horizonStatements = `SELECT
 coalesce(sum(calls) FILTER (WHERE query LIKE '-- name: ClaimInbox :many%'), 0)::bigint,
 coalesce(sum(total_exec_time) FILTER (WHERE query LIKE '-- name: ClaimInbox :many%'), 0)::float8,
 coalesce(sum(calls) FILTER (WHERE query LIKE '-- name: PendingBatch :many%' OR query LIKE '-- name: PendingBatchMany :many%'), 0)::bigint,
 coalesce(sum(total_exec_time) FILTER (WHERE query LIKE '-- name: PendingBatch :many%' OR query LIKE '-- name: PendingBatchMany :many%'), 0)::float8,
 coalesce(sum(calls) FILTER (WHERE query LIKE '-- name: InsertInbox :many%'), 0)::bigint,
 coalesce(sum(total_exec_time) FILTER (WHERE query LIKE '-- name: InsertInbox :many%'), 0)::float8
FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())`

// horizonExplainInbox is the inbox claim's scan (ClaimInbox's due CTE
// without its lock): what a claim walks.
const horizonExplainInbox = `EXPLAIN (ANALYZE, BUFFERS, COSTS OFF)
SELECT i.handler, i.dedup_key FROM pgrelay.inbox i
WHERE i.handler = $1 AND i.status = 'pending' AND i.next_attempt_at <= now()
ORDER BY i.next_attempt_at LIMIT 50`

// horizonExplainBounded is the same scan started a second back, as a
// claim bounded past the entries already claimed starts it (ClaimInbox's
// not_before and since).
const horizonExplainBounded = `EXPLAIN (ANALYZE, BUFFERS, COSTS OFF)
SELECT i.handler, i.dedup_key FROM pgrelay.inbox i
WHERE i.handler = $1 AND i.status = 'pending' AND i.next_attempt_at <= now()
  AND i.next_attempt_at >= now() - interval '1 second'
ORDER BY i.next_attempt_at LIMIT 50`

// horizonExplainOutbox is the first branch of the relay's claim
// (PendingBatch) for partition 0.
const horizonExplainOutbox = `EXPLAIN (ANALYZE, BUFFERS, COSTS OFF)
SELECT o.id FROM pgrelay.outbox o
WHERE o.partition = 0 AND o.status = 'pending' AND o.not_before IS NULL
ORDER BY o.partition, o.not_before, o.id LIMIT 100`

func (b *bench) runHorizonGroup(ctx context.Context) {
	ids := []string{"horizon_backlog_end", "horizon_inbox_oldest_end", "horizon_outbox_oldest_end", "horizon_applied_hold",
		"horizon_inbox_claim_first", "horizon_inbox_claim_last", "horizon_relay_claim_first", "horizon_relay_claim_last",
		"horizon_inbox_dead_end", "horizon_recovery", "horizon_drain_after"}
	hb := *b
	hb.cfg.Timeout = b.cfg.HorizonHold + b.cfg.HorizonAfter + 5*time.Minute
	hb.attempt(ctx, "held horizon", ids, hb.horizon)
	b.note("horizon_backlog_end", fmt.Sprintf("%d events/s offered (1 per transaction, 4 producers); REPEATABLE READ transaction held %s; private cluster, default settings, autovacuum on; services in-process",
		b.cfg.HorizonRate, b.cfg.HorizonHold))
}

// horizon runs the held-horizon measurement once.
func (b *bench) horizon(ctx context.Context) (err error) {
	cl, stop, err := startPrivateCluster("shared_preload_libraries = 'pg_stat_statements'\npg_stat_statements.track = 'top'")
	if err != nil {
		return err
	}
	defer stop()
	dbs, err := newDatabases(ctx, cl.URL(), b.log)
	if dbs != nil {
		defer dbs.dropAll()
	}
	if err != nil {
		return err
	}
	hb := *b
	hb.dbs, hb.bins = dbs, nil
	p, err := hb.startPipeline(ctx, 0)
	if err != nil {
		return err
	}
	defer p.close()
	if _, err := p.pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		return fmt.Errorf("pg_stat_statements: %w", err)
	}

	rate := b.cfg.HorizonRate
	sampleEvery := b.cfg.HorizonSample
	before := sampleEvery // one sample interval of load without the hold
	hold, after := b.cfg.HorizonHold, b.cfg.HorizonAfter

	loadCtx, stopLoad := context.WithCancel(ctx)
	var loadWG sync.WaitGroup
	defer func() { stopLoad(); loadWG.Wait() }()
	var produced atomic.Int64
	prodErr := make(chan error, 1)
	start := time.Now()
	loadWG.Go(func() { prodErr <- p.steady(loadCtx, rate, start, &produced) })

	// The holder: a REPEATABLE READ transaction in the same database that
	// has read something, so its snapshot holds the xmin horizon.
	holdStart, holdEnd := start.Add(before), start.Add(before+hold)
	var holdErr atomic.Value
	loadWG.Go(func() {
		if err := p.holdHorizon(loadCtx, holdStart, holdEnd); err != nil && loadCtx.Err() == nil {
			holdErr.Store(err)
		}
	})

	// The backlog (produced, not yet credited) every second, for the
	// recovery time.
	var samples []horizonSample
	var prevStmts [6]float64
	if prevStmts, err = readStatements(ctx, p); err != nil {
		return err
	}
	var prevApplied int64
	prevAt := time.Duration(0)
	var recovered time.Duration = -1
	var backlogAtRelease int64 = -1
	end := start.Add(before + hold + after)
	nextSample := start.Add(sampleEvery)
	var explained bool
	fmt.Printf("held horizon: %d events/s, hold %s from %s, then %s (load %s)\n", rate, hold, before, after, loadAvg())
	fmt.Println(horizonHeader)
	for time.Now().Before(end) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-prodErr:
			if err != nil {
				return err
			}
			prodErr = nil
		case err := <-p.failed:
			return err
		case <-time.After(time.Second):
		}
		if e, ok := holdErr.Load().(error); ok {
			return fmt.Errorf("holding transaction: %w", e)
		}
		now := time.Now()
		if !explained && now.After(holdEnd.Add(-3*time.Second)) {
			explained = true
			b.horizonExplain(ctx, p, "end of hold")
		}
		if now.After(holdEnd) && recovered < 0 {
			applied, err := count(ctx, p.pool, "SELECT count(*) FROM ledger_entries")
			if err != nil {
				return err
			}
			backlog := produced.Load() - applied
			if backlogAtRelease < 0 {
				backlogAtRelease = backlog
			}
			if backlog <= int64(rate) {
				recovered = now.Sub(holdEnd)
			}
		}
		if now.Before(nextSample) {
			continue
		}
		nextSample = nextSample.Add(sampleEvery)
		// Produced as the sample's snapshot is taken: under a held horizon
		// the sample takes seconds, and counting produced after it showed
		// those seconds' events as a backlog.
		sampledProduced := produced.Load()
		s, stmts, err := p.horizonSample(ctx, prevStmts)
		if err != nil {
			return err
		}
		prevStmts = stmts
		s.at = now.Sub(start)
		s.produced = sampledProduced
		s.appliedRate = float64(s.applied-prevApplied) / (s.at - prevAt).Seconds()
		prevApplied, prevAt = s.applied, s.at
		switch {
		case now.Before(holdStart):
			s.phase = "before"
		case now.Before(holdEnd):
			s.phase = "hold"
		default:
			s.phase = "after"
		}
		samples = append(samples, s)
		fmt.Println(s.row())
	}
	stopLoad()
	b.horizonExplain(ctx, p, "after the release")
	if err := b.writeHorizonTable(samples); err != nil {
		b.log.Warn("horizon table", slog.Any("error", err))
	}
	b.horizonFigures(samples, recovered, backlogAtRelease)
	return nil
}

// horizonFigures records the run's figures from its samples.
func (b *bench) horizonFigures(samples []horizonSample, recovered time.Duration, backlogAtRelease int64) {
	var hold, afterS []horizonSample
	for _, s := range samples {
		switch s.phase {
		case "hold":
			hold = append(hold, s)
		case "after":
			afterS = append(afterS, s)
		}
	}
	if len(hold) == 0 {
		return
	}
	last := hold[len(hold)-1]
	// A producer counts its event after the commit returned, which the
	// pipeline can beat: never less than nothing.
	b.sample("horizon_backlog_end", float64(max(last.produced-last.applied, 0)))
	b.sample("horizon_inbox_oldest_end", last.inboxOldest)
	b.sample("horizon_outbox_oldest_end", last.outboxOldest)
	b.sample("horizon_inbox_dead_end", float64(last.inboxDead))
	// The applied rate over the last third of the hold.
	tail := hold[len(hold)*2/3:]
	var rs float64
	for _, s := range tail {
		rs += s.appliedRate
	}
	b.sample("horizon_applied_hold", rs/float64(len(tail)))
	firstLast := func(id string, ms func(horizonSample) float64) {
		var first, lastV float64 = math.NaN(), math.NaN()
		for _, s := range hold {
			if v := ms(s); !math.IsNaN(v) {
				if math.IsNaN(first) {
					first = v
				}
				lastV = v
			}
		}
		if !math.IsNaN(first) {
			b.sample(id+"_first", first)
			b.sample(id+"_last", lastV)
		}
	}
	firstLast("horizon_inbox_claim", func(s horizonSample) float64 { return s.inboxClaimMs })
	firstLast("horizon_relay_claim", func(s horizonSample) float64 { return s.relayClaimMs })
	if recovered >= 0 {
		b.sample("horizon_recovery", float64(recovered.Milliseconds()))
	} else if f := b.res.lookup("horizon_recovery"); f != nil {
		f.Error = fmt.Sprintf("backlog still above one second of load when the run ended (%d events at the release)", backlogAtRelease)
	}
	if len(afterS) > 0 {
		b.sample("horizon_drain_after", afterS[0].appliedRate)
	}
	b.note("horizon_recovery", fmt.Sprintf("from the release until at most one second of load (%d events) is unapplied; %d unapplied at the release", b.cfg.HorizonRate, backlogAtRelease))
}

// steady produces rate events a second, one per transaction, from 4
// connections, until ctx ends.
func (p *pipeline) steady(ctx context.Context, rate int, start time.Time, produced *atomic.Int64) error {
	gen := newGenerator("horizon")
	tickets := make(chan int, 4*rate+16)
	go func() {
		defer close(tickets)
		for i := 0; ; i++ {
			due := start.Add(time.Duration(float64(i) / float64(rate) * float64(time.Second)))
			if d := time.Until(due); d > 0 {
				select {
				case <-ctx.Done():
					return
				case <-time.After(d):
				}
			}
			select {
			case <-ctx.Done():
				return
			case tickets <- i:
			}
		}
	}()
	err := fanOut(ctx, 4, func(ctx context.Context, _ int) error {
		for i := range tickets {
			e := gen.event(i)
			tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err := pgx.BeginFunc(tctx, p.pool, func(tx pgx.Tx) error {
				return pgrelay.Enqueue(tctx, tx, pgrelay.Message{EventID: e.id, Topic: topic, Key: e.key, EventType: eventType, Payload: e.payload})
			})
			cancel()
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("produce: %w", err)
			}
			produced.Add(1)
		}
		return nil
	})
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// holdHorizon opens, at from, a REPEATABLE READ transaction that reads the
// ledger's orders and keeps it open until until (or ctx ends).
func (p *pipeline) holdHorizon(ctx context.Context, from, until time.Time) error {
	select {
	case <-ctx.Done():
		return nil
	case <-time.After(time.Until(from)):
	}
	conn, err := pgx.Connect(ctx, p.url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		return err
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck
	var n int64
	if err := tx.QueryRow(ctx, "SELECT count(*) FROM ledger_orders").Scan(&n); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
	case <-time.After(time.Until(until)):
	}
	cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return tx.Commit(cctx)
}

func readStatements(ctx context.Context, p *pipeline) ([6]float64, error) {
	var v [6]float64
	var c0, c1, c2 int64
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err := p.pool.QueryRow(qctx, horizonStatements).Scan(&c0, &v[1], &c1, &v[3], &c2, &v[5])
	v[0], v[2], v[4] = float64(c0), float64(c1), float64(c2)
	if err != nil {
		return v, fmt.Errorf("pg_stat_statements: %w", err)
	}
	return v, nil
}

// horizonSample reads one sample (all but its times and phase).
func (p *pipeline) horizonSample(ctx context.Context, prev [6]float64) (horizonSample, [6]float64, error) {
	var s horizonSample
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := p.pool.QueryRow(qctx, horizonState).Scan(&s.outboxPending, &s.outboxOldest, &s.inboxPending, &s.inboxOldest, &s.applied,
		&s.outboxDead, &s.inboxDead, &s.outboxTable, &s.outboxIndexes, &s.inboxTable, &s.inboxIndexes); err != nil {
		return s, prev, fmt.Errorf("sample: %w", err)
	}
	cur, err := readStatements(ctx, p)
	if err != nil {
		return s, prev, err
	}
	mean := func(calls, ms int) float64 {
		if n := cur[calls] - prev[calls]; n > 0 {
			return (cur[ms] - prev[ms]) / n
		}
		return math.NaN()
	}
	s.inboxClaims, s.relayClaims = int64(cur[0]-prev[0]), int64(cur[2]-prev[2])
	s.inboxClaimMs, s.relayClaimMs, s.inboxInsertMs = mean(0, 1), mean(2, 3), mean(4, 5)
	return s, cur, nil
}

const horizonHeader = "  time phase   produced    applied  applied/s  outbox pend oldest ms  inbox pend oldest ms  dead outbox   dead inbox  outbox tbl+idx MiB  inbox tbl+idx MiB  inbox claims ms/claim  relay claims ms/claim  store ms"

func (s horizonSample) row() string {
	mib := func(v int64) float64 { return float64(v) / (1 << 20) }
	return fmt.Sprintf("%5.0fs %-6s %10d %10d %10.0f %12d %10.0f %10d %10.0f %12d %12d %9.1f+%-8.1f %8.1f+%-8.1f %12d %9.2f %12d %9.2f %9.2f",
		s.at.Seconds(), s.phase, s.produced, s.applied, s.appliedRate, s.outboxPending, s.outboxOldest, s.inboxPending, s.inboxOldest,
		s.outboxDead, s.inboxDead, mib(s.outboxTable), mib(s.outboxIndexes), mib(s.inboxTable), mib(s.inboxIndexes),
		s.inboxClaims, s.inboxClaimMs, s.relayClaims, s.relayClaimMs, s.inboxInsertMs)
}

func (b *bench) writeHorizonTable(samples []horizonSample) error {
	var sb strings.Builder
	fmt.Fprintf(&sb, "held horizon: %d events/s, hold %s, after %s; load %s\n%s\n", b.cfg.HorizonRate, b.cfg.HorizonHold, b.cfg.HorizonAfter, loadAvg(), horizonHeader)
	for _, s := range samples {
		sb.WriteString(s.row() + "\n")
	}
	return os.WriteFile(filepath.Join(b.cfg.OutDir, "horizon.txt"), []byte(sb.String()), 0o644)
}

// horizonExplain prints the plans of the inbox's and the relay's claim
// scans with their buffers.
func (b *bench) horizonExplain(ctx context.Context, p *pipeline, when string) {
	for _, q := range []struct {
		what, sql string
		args      []any
	}{{"inbox claim scan", horizonExplainInbox, []any{pgrelay.DefaultHandlerName}},
		{"inbox claim scan from a second back", horizonExplainBounded, []any{pgrelay.DefaultHandlerName}}, {"relay claim scan (partition 0)", horizonExplainOutbox, nil}} {
		qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		rows, err := p.pool.Query(qctx, q.sql, q.args...)
		var lines []string
		for err == nil && rows.Next() {
			var l string
			if err = rows.Scan(&l); err == nil {
				lines = append(lines, "  "+l)
			}
		}
		if err == nil {
			err = rows.Err()
		}
		if rows != nil {
			rows.Close()
		}
		cancel()
		if err != nil {
			b.log.Warn("explain", slog.String("what", q.what), slog.Any("error", err))
			continue
		}
		fmt.Printf("%s, %s:\n%s\n", q.what, when, strings.Join(lines, "\n"))
	}
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// startPrivateCluster starts an internal/testcluster cluster outside a test
// and returns it with the function that stops and removes it.
func startPrivateCluster(conf string) (c *testcluster.Cluster, stop func(), err error) {
	tb := &clusterTB{}
	stop = func() {
		for i := len(tb.cleanups) - 1; i >= 0; i-- {
			tb.cleanups[i]()
		}
	}
	defer func() {
		if p := recover(); p != nil {
			stop()
			if f, ok := p.(clusterFatal); ok {
				c, err = nil, errors.New(string(f))
				return
			}
			panic(p)
		}
	}()
	return testcluster.Start(tb, conf), stop, nil
}

// clusterTB is the testing.TB testcluster.Start needs, outside a test: a
// fatal error panics with clusterFatal, which startPrivateCluster returns as
// an error; cleanups run when the cluster is stopped.
type clusterTB struct {
	testing.TB
	cleanups []func()
	failed   bool
}

type clusterFatal string

func (t *clusterTB) Helper()                         {}
func (t *clusterTB) Cleanup(f func())                { t.cleanups = append(t.cleanups, f) }
func (t *clusterTB) Failed() bool                    { return t.failed }
func (t *clusterTB) Logf(format string, args ...any) {}
func (t *clusterTB) Fatal(args ...any)               { t.fail(fmt.Sprint(args...)) }
func (t *clusterTB) Fatalf(format string, args ...any) {
	t.fail(fmt.Sprintf(format, args...))
}
func (t *clusterTB) Skipf(format string, args ...any) {
	t.fail("private cluster: " + fmt.Sprintf(format, args...))
}
func (t *clusterTB) fail(msg string) {
	t.failed = true
	panic(clusterFatal(msg))
}
