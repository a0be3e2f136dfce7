package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"os"
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
	"github.com/pgrelay/pgrelay/relay"
)

// observePoll is how often the observer looks for new ledger credits in the
// runs at an offered load. An event's latency is measured to the poll that
// first saw its credit, so it overstates the true commit→ledger time by at
// most this plus one query.
const observePoll = time.Millisecond

// throughputPoll is the observer's poll in the flat-out runs, whose figure is
// a throughput over seconds: polling every millisecond there took about a
// quarter of a core from the pipeline it measured (top, 60,000-event run),
// while 10 ms moves the end of a multi-second run by at most 10 ms. Their
// latency percentiles (hundreds of milliseconds of queueing) are coarser by
// as much.
const throughputPoll = 10 * time.Millisecond

// ledgerSince lists the credits newer than an id: the observer's poll, served
// by the primary key.
const ledgerSince = `SELECT id, event_id FROM ledger_entries WHERE id > $1 ORDER BY id`

// ledgerHoles reads the credits in id ranges the observer passed over
// ($1[i] <= id < $2[i]).
const ledgerHoles = `SELECT l.id, l.event_id FROM ledger_entries l
JOIN unnest($1::bigint[], $2::bigint[]) AS h(lo, hi) ON l.id >= h.lo AND l.id < h.hi`

// pipeline is one running relay → NATS → consumer → inbox → ledger chain over
// a fresh database and stream.
type pipeline struct {
	b      *bench
	pool   *pgxpool.Pool // the producers' and the observer's pool
	url    string
	stream string
	prefix string
	mode   string
	failed chan error
	stop   func()
	procs  map[string]*process // the services, when run as processes
	// maxWait overrides the consumer's MaxWait when not zero.
	maxWait time.Duration
	// traces count the in-process services' statements (-sql-trace).
	traces []*sqlTrace
	// emit makes the producers write with pgrelay.Emit (WAL capture).
	emit bool
	// observer is how a credit is timed: observerPoll (also when empty) or
	// observerCommitTS.
	observer string
}

// traced prints and resets the statement counts of the run just finished
// (-sql-trace with in-process services), labelled with what it was.
func (p *pipeline) traced(label string) {
	if len(p.traces) == 0 {
		return
	}
	fmt.Fprintf(os.Stderr, "sql trace, %s:\n", label)
	for _, t := range p.traces {
		fmt.Fprint(os.Stderr, t.reset())
	}
}

// startPipeline starts the relay and the consumer (as processes when the
// binaries are available, otherwise in this process) on a fresh database and
// stream, with the product's default settings except a consumer MaxWait
// when maxWait is not zero.
func (b *bench) startPipeline(ctx context.Context, maxWait time.Duration) (*pipeline, error) {
	pool, url, err := b.dbs.fresh(ctx, b.cfg.Workers+8)
	if err != nil {
		return nil, err
	}
	if err := seedOrders(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	stream, prefix, err := b.nats.stream(ctx)
	if err != nil {
		pool.Close()
		return nil, err
	}
	p := &pipeline{b: b, pool: pool, url: url, stream: stream, prefix: prefix, failed: make(chan error, 4), maxWait: maxWait}
	if p.observer, err = b.observerFor(b.dbs); err != nil {
		p.close()
		return nil, err
	}
	if b.bins != nil {
		err = p.startProcesses(ctx)
	} else {
		err = p.startInProcess(ctx)
	}
	if err != nil {
		p.close()
		return nil, err
	}
	// Warm up: a few events through the whole chain before measuring.
	if _, err := p.run(ctx, 10, 10, 1, 0, 0); err != nil {
		p.close()
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	for _, t := range p.traces {
		t.reset()
	}
	return p, nil
}

func (p *pipeline) startInProcess(ctx context.Context) error {
	b := p.b
	p.mode = "in-process"
	runCtx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	p.stop = func() { cancel(); wg.Wait() }

	var rtrace, ctrace *sqlTrace
	if b.cfg.SQLTrace {
		rtrace, ctrace = newSQLTrace("relay"), newSQLTrace("consumer")
		p.traces = []*sqlTrace{rtrace, ctrace}
	}
	rpool, err := openTracedPool(ctx, p.url, 10, rtrace)
	if err != nil {
		return err
	}
	pub, err := nats.NewPublisher(ctx, nats.Config{URL: b.nats.url, SubjectPrefix: p.prefix, Stream: p.stream,
		Logger: logbridge.AtLeast(b.log.With(slog.String("logger", "nats")), slog.LevelError)})
	if err != nil {
		rpool.Close()
		return err
	}
	r, err := relay.New(relay.Config{Pool: rpool, Publisher: pub, Logger: b.log.With(slog.String("logger", "relay"))})
	if err != nil {
		pub.Close()
		rpool.Close()
		return err
	}
	cpool, err := openTracedPool(ctx, p.url, pgrelay.DefaultWorkers+consumer.DefaultIngestLoops+2, ctrace)
	if err != nil {
		pub.Close()
		rpool.Close()
		return err
	}
	c, err := consumer.New(consumer.Config{
		Pool: cpool, MaxWait: p.maxWait,
		Subscribe: broker.Subscribe(nats.NewSubscriber, nats.Config{URL: b.nats.url, Stream: p.stream, SubjectPrefix: p.prefix,
			Durable: "bench", MaxAckPending: 10 * consumer.DefaultFetchBatchSize, MaxPayloadBytes: consumer.DefaultMaxPayloadBytes}),
		StatsInterval: -1, Logger: b.log.With(slog.String("logger", "consumer")), Inbox: pgrelay.InboxConfig{Handler: ledger.Handler{}},
	})
	if err != nil {
		pub.Close()
		rpool.Close()
		cpool.Close()
		return err
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		defer rpool.Close()
		defer pub.Close()
		if err := r.Run(runCtx); err != nil || runCtx.Err() == nil {
			p.failed <- fmt.Errorf("relay stopped: %v", err)
		}
	}()
	go func() {
		defer wg.Done()
		defer cpool.Close()
		if err := c.Run(runCtx); err != nil || runCtx.Err() == nil {
			p.failed <- fmt.Errorf("consumer stopped: %v", err)
		}
	}()
	return nil
}

func (p *pipeline) close() {
	if p.stop != nil {
		p.stop()
	}
	p.b.nats.dropStream(p.stream)
	p.pool.Close()
}

// pipelineState is where the events are, for error messages.
const pipelineState = `SELECT format('outbox: %s; inbox: %s; ledger: %s',
    (SELECT string_agg(status || ' ' || n, ', ') FROM (SELECT status, count(*) AS n FROM pgrelay.outbox GROUP BY status) s),
    (SELECT string_agg(status || ' ' || n, ', ') FROM (SELECT status, count(*) AS n FROM pgrelay.inbox GROUP BY status) s),
    (SELECT count(*) FROM ledger_entries))`

func (p *pipeline) state() string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var s string
	if err := p.pool.QueryRow(ctx, pipelineState).Scan(&s); err != nil {
		return "state unknown: " + err.Error()
	}
	return s
}

// runResult is what one run through the pipeline measured.
type runResult struct {
	events    int
	elapsed   time.Duration   // first produce to last credit seen
	latencies []time.Duration // commit→ledger, sorted
	achieved  float64         // the producers' achieved rate (events/s)
	prefix    string          // the run's event id prefix
	commitAt  []int64         // per event: UnixNano when its producer's commit returned (0: not produced)
	seenAt    []int64         // per event: UnixNano when the observer saw its credit
}

// stageTimes reads, for a run's events, the server's wall-clock timestamps
// of the two hand-overs in between: the relay's mark (outbox.published_at,
// the start of the mark's transaction, after the broker acknowledged the
// publish) and the consumer's store (inbox.received_at, the start of the
// transaction that stored it). The server runs on the benchmark's machine,
// so they compare with the producer's commit and the observer's sighting,
// taken on the same clock.
const stageTimes = `SELECT o.event_id, o.published_at, i.received_at
FROM pgrelay.outbox o JOIN pgrelay.inbox i USING (event_id)
WHERE starts_with(o.event_id, $1)`

// stageSplit is the median of each stage of a run's events, in ms: the
// producer's commit to the relay's mark (wake-up, read, publish, broker
// ack), the mark to the consumer's store (fetch; the message may arrive
// before the mark starts, so this is small or negative), and the store to
// the observer seeing the credit (the consumer's transaction, its commit,
// and at most one observer poll).
type stageSplit struct{ relay, consumer, inbox float64 }

// stages splits a run's latencies into stages; see stageSplit.
func (p *pipeline) stages(ctx context.Context, r runResult) (stageSplit, error) {
	rows, err := p.pool.Query(ctx, stageTimes, r.prefix)
	if err != nil {
		return stageSplit{}, err
	}
	defer rows.Close()
	var relay, consumer, inbox []time.Duration
	for rows.Next() {
		var id string
		var published, received *time.Time
		if err := rows.Scan(&id, &published, &received); err != nil {
			return stageSplit{}, err
		}
		if published == nil || received == nil {
			continue // credited before the relay's mark committed
		}
		i, err := strconv.Atoi(strings.TrimPrefix(id, r.prefix))
		if err != nil || i < 0 || i >= len(r.commitAt) || r.commitAt[i] == 0 || r.seenAt[i] == 0 {
			continue
		}
		relay = append(relay, published.Sub(time.Unix(0, r.commitAt[i])))
		consumer = append(consumer, received.Sub(*published))
		inbox = append(inbox, time.Unix(0, r.seenAt[i]).Sub(*received))
	}
	if err := rows.Err(); err != nil {
		return stageSplit{}, err
	}
	med := func(d []time.Duration) float64 {
		slices.Sort(d)
		return ms(percentile(d, 50))
	}
	return stageSplit{relay: med(relay), consumer: med(consumer), inbox: med(inbox)}, nil
}

// run produces n events through the pipeline, perTx events per transaction
// from producers goroutines, at offered events/s (0: flat out), and waits
// until every one is credited in the ledger.
//
// With a rate offered, production stops after duration even when the
// producers fell behind (an overload): then the events committed by that time
// are the ones measured, and achieved reports the rate they reached.
func (p *pipeline) run(ctx context.Context, n, perTx, producers int, offered float64, duration time.Duration) (runResult, error) {
	gen := newGenerator("e2e")
	commitAt := make([]atomic.Int64, n)
	res := runResult{events: n, prefix: gen.prefix}
	var target, committed atomic.Int64
	target.Store(int64(n))

	obsCtx, stopObs := context.WithCancel(ctx)
	defer stopObs()
	seen := make(chan []time.Duration, 1)
	seenAt := make([]int64, n) // written by the observer, read after it sent on seen
	obsErr := make(chan error, 1)
	var lastSeen atomic.Int64
	poll := observePoll
	if offered == 0 || p.observer == observerCommitTS {
		// The commit-timestamp observer polls only to know when every
		// credit is in: the times come from the server afterwards.
		poll = throughputPoll
	}
	// The producers start once the observer took its starting point: a
	// credit inserted before it would never be seen.
	ready := make(chan struct{})
	go func() {
		lat, err := p.observe(obsCtx, gen, n, poll, &target, commitAt, seenAt, &lastSeen, ready)
		if err != nil {
			obsErr <- err
			return
		}
		seen <- lat
	}()
	select {
	case <-ready:
	case err := <-obsErr:
		return res, err
	}

	// Tickets hand out the transactions: one per perTx events, released on
	// schedule when a rate is offered, all at once otherwise.
	txs := (n + perTx - 1) / perTx
	tickets := make(chan int, txs)
	start := time.Now()
	stopAt := time.Time{}
	if offered > 0 && duration > 0 {
		stopAt = start.Add(duration)
	}
	over := func() bool { return !stopAt.IsZero() && time.Now().After(stopAt) }
	go func() {
		defer close(tickets)
		for i := range txs {
			if over() {
				return
			}
			if offered > 0 {
				due := start.Add(time.Duration(float64(i*perTx) / offered * float64(time.Second)))
				if d := time.Until(due); d > 0 {
					select {
					case <-ctx.Done():
						return
					case <-time.After(d):
					}
				}
			}
			tickets <- i
		}
	}()
	err := fanOut(ctx, producers, func(ctx context.Context, _ int) error {
		msgs := make([]pgrelay.Message, 0, perTx)
		for i := range tickets {
			if over() {
				continue // the load's time is up: leave the rest unproduced
			}
			from, to := i*perTx, min((i+1)*perTx, n)
			msgs = msgs[:0]
			for j := from; j < to; j++ {
				e := gen.event(j)
				msgs = append(msgs, pgrelay.Message{EventID: e.id, Topic: topic, Key: e.key, EventType: eventType, Payload: e.payload})
			}
			tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err := pgx.BeginFunc(tctx, p.pool, func(tx pgx.Tx) error {
				if p.emit {
					return pgrelay.Emit(tctx, tx, msgs...)
				}
				return pgrelay.Enqueue(tctx, tx, msgs...)
			})
			cancel()
			if err != nil {
				return fmt.Errorf("produce: %w", err)
			}
			now := time.Now().UnixNano()
			for j := from; j < to; j++ {
				commitAt[j].Store(now)
			}
			committed.Add(int64(to - from))
		}
		return nil
	})
	produced := time.Since(start)
	if err != nil {
		return res, err
	}
	res.events = int(committed.Load())
	target.Store(committed.Load())
	res.achieved = rate(res.events, produced)
	select {
	case lat := <-seen:
		res.latencies = lat
		res.seenAt = seenAt
		res.commitAt = make([]int64, n)
		for i := range commitAt {
			res.commitAt[i] = commitAt[i].Load()
		}
	case err := <-obsErr:
		return res, err
	case err := <-p.failed:
		return res, err
	case <-ctx.Done():
		return res, fmt.Errorf("waiting for the ledger: %w (%s)", context.Cause(ctx), p.state())
	}
	if p.observer == observerCommitTS {
		var last int64
		if res.latencies, last, err = p.commitTimes(ctx, gen, res.commitAt, res.seenAt); err != nil {
			return res, err
		}
		lastSeen.Store(last)
	}
	res.elapsed = time.Duration(lastSeen.Load()) - time.Duration(start.UnixNano())
	return res, nil
}

// observe polls the ledger until it has seen the n events of gen credited,
// and returns their commit→ledger latencies, sorted.
//
// Ledger ids are taken when a credit is inserted, not when it commits, so
// concurrent inbox batches commit out of id order: a cursor on the highest id
// seen would skip a batch that commits late. The observer keeps instead the
// lowest id not seen yet (low) and re-reads from there, skipping ids it has
// seen; an id missing for more than gapTimeout below one it has seen is
// taken for a rolled-back insert and passed over. The ranges passed over are
// still read on every poll (ledgerHoles), for an insert that was only slow:
// with concurrent inbox transactions under a heavy load one committed after
// such a jump, and the run waited for its credit for ever.
func (p *pipeline) observe(ctx context.Context, gen generator, n int, poll time.Duration, target *atomic.Int64, commitAt []atomic.Int64, seenAt []int64, lastSeen *atomic.Int64, ready chan<- struct{}) ([]time.Duration, error) {
	const gapTimeout = 10 * time.Second
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	var low int64
	if err := conn.QueryRow(ctx, "SELECT coalesce(max(id), 0) + 1 FROM ledger_entries").Scan(&low); err != nil {
		return nil, err
	}
	close(ready)
	seen := map[int64]bool{}
	stalledSince := time.Now()
	// holes are the ranges [holeLo[k], holeHi[k]) passed over; holeSeen the
	// ids found in them since.
	var holeLo, holeHi []int64
	holeSeen := map[int64]bool{}
	lat := make([]time.Duration, 0, n)
	t := time.NewTicker(poll)
	defer t.Stop()
	for len(lat) < int(target.Load()) {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
		}
		rows, err := conn.Query(ctx, ledgerSince, low-1)
		if err != nil {
			return nil, err
		}
		var ids []string
		for rows.Next() {
			var id int64
			var eventID string
			if err := rows.Scan(&id, &eventID); err != nil {
				rows.Close()
				return nil, err
			}
			if !seen[id] {
				seen[id] = true
				ids = append(ids, eventID)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
		if len(holeLo) > 0 {
			rows, err := conn.Query(ctx, ledgerHoles, holeLo, holeHi)
			if err != nil {
				return nil, err
			}
			for rows.Next() {
				var id int64
				var eventID string
				if err := rows.Scan(&id, &eventID); err != nil {
					rows.Close()
					return nil, err
				}
				if !holeSeen[id] {
					holeSeen[id] = true
					ids = append(ids, eventID)
				}
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return nil, err
			}
		}
		now := time.Now()
		for _, id := range ids {
			idx, ok := strings.CutPrefix(id, gen.prefix)
			if !ok {
				continue // another run's event
			}
			i, err := strconv.Atoi(idx)
			if err != nil || i < 0 || i >= n {
				return nil, fmt.Errorf("observer: unexpected event id %q", id)
			}
			c := commitAt[i].Load()
			if c == 0 {
				// The credit was seen before the producer's commit returned:
				// count the latency as zero rather than guess.
				c = now.UnixNano()
			}
			lat = append(lat, time.Duration(now.UnixNano()-c))
			seenAt[i] = now.UnixNano()
		}
		if len(ids) > 0 {
			lastSeen.Store(now.UnixNano())
		}
		// Advance low over the ids seen. A gap below the lowest id seen that
		// has lasted gapTimeout is a rolled-back insert: jump over it (only
		// it: ids above the lowest seen may still be in flight).
		moved := false
		if len(seen) > 0 && !seen[low] && now.Sub(stalledSince) > gapTimeout {
			next := slices.Min(slices.Collect(maps.Keys(seen)))
			holeLo, holeHi = append(holeLo, low), append(holeHi, next)
			low = next
		}
		for seen[low] {
			delete(seen, low)
			low++
			moved = true
		}
		if moved || len(seen) == 0 {
			stalledSince = now
		}
	}
	slices.Sort(lat)
	return lat, nil
}

// percentile returns the p-th percentile (0..100) of sorted durations, by the
// nearest-rank method.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = max(1, min(rank, len(sorted)))
	return sorted[rank-1]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func (b *bench) runE2EGroup(ctx context.Context) {
	n, w := b.cfg.Events, b.cfg.Workers
	// One event per transaction is a few hundred events/s end to end here:
	// a quarter of the backlog keeps the run short and still long enough.
	nOne := max(b.cfg.BatchSize, n/4)
	mode := "in-process"
	if b.bins != nil {
		mode = "process"
	}
	for _, f := range b.res.Figures {
		if f.Group == "e2e" {
			f.Mode = mode
		}
	}
	latIDs := func(l string) []string {
		ids := []string{"latency_" + l + "_p50", "latency_" + l + "_p99", "latency_" + l + "_max"}
		if l != "max" && l != "tuned" {
			ids = append(ids, "achieved_"+l, "stage_"+l+"_relay", "stage_"+l+"_consumer", "stage_"+l+"_inbox")
		}
		return ids
	}
	recordLatency := func(l string, r runResult) {
		b.sample("latency_"+l+"_p50", ms(percentile(r.latencies, 50)))
		b.sample("latency_"+l+"_p99", ms(percentile(r.latencies, 99)))
		b.sample("latency_"+l+"_max", ms(percentile(r.latencies, 100)))
		if l != "max" && l != "tuned" {
			b.sample("achieved_"+l, r.achieved)
		}
	}
	for range b.cfg.Repeats {
		all := append([]string{"e2e_batch", "e2e_one"}, latIDs("max")...)
		all = append(all, cpuIDs("e2e_batch")...)
		all = append(all, cpuIDs("e2e_one")...)
		for _, l := range b.cfg.Loads {
			all = append(all, latIDs(itoa(l))...)
			all = append(all, cpuIDs("load_"+itoa(l))...)
		}
		b.attempt(ctx, "end to end", all, func(ctx context.Context) error {
			p, err := b.startPipeline(ctx, 0)
			if err != nil {
				return err
			}
			defer p.close()
			// Each run's CPU per event: /proc read at its start and end.
			cpu := b.cpuSources(b.dbs, p.procs)
			measured := func(run string, fn func() (runResult, error)) (runResult, error) {
				before := cpu.snapshot()
				r, err := fn()
				if err != nil {
					b.fail(cpuIDs(run), err)
					return r, err
				}
				b.recordCPU(run, cpu.snapshot().since(before), r.events)
				return r, nil
			}
			var errs []error
			// Flat out, batched producers.
			if r, err := measured("e2e_batch", func() (runResult, error) { return p.run(ctx, n, b.cfg.BatchSize, w, 0, 0) }); err != nil {
				errs = append(errs, fmt.Errorf("flat out, %d/tx: %w", b.cfg.BatchSize, err))
				b.fail([]string{"e2e_batch"}, errs[len(errs)-1])
			} else {
				b.sample("e2e_batch", rate(r.events, r.elapsed))
			}
			p.traced(fmt.Sprintf("flat out, %d/tx", b.cfg.BatchSize))
			// Flat out, one event per transaction: throughput and latency.
			if r, err := measured("e2e_one", func() (runResult, error) { return p.run(ctx, nOne, 1, w, 0, 0) }); err != nil {
				errs = append(errs, fmt.Errorf("flat out, 1/tx: %w", err))
				b.fail(append([]string{"e2e_one"}, latIDs("max")...), errs[len(errs)-1])
			} else {
				b.sample("e2e_one", rate(r.events, r.elapsed))
				recordLatency("max", r)
			}
			p.traced("flat out, 1/tx")
			// Fixed offered loads, one event per transaction.
			for _, l := range b.cfg.Loads {
				events := max(1, int(float64(l)*b.cfg.LoadDuration.Seconds()))
				r, err := measured("load_"+itoa(l), func() (runResult, error) {
					return p.run(ctx, events, 1, max(w, 8), float64(l), b.cfg.LoadDuration)
				})
				if err != nil {
					errs = append(errs, fmt.Errorf("at %d/s: %w", l, err))
					b.fail(latIDs(itoa(l)), errs[len(errs)-1])
					continue
				}
				recordLatency(itoa(l), r)
				p.traced(fmt.Sprintf("%d/s offered, 1/tx", l))
				st, err := p.stages(ctx, r)
				if err != nil {
					errs = append(errs, fmt.Errorf("stages at %d/s: %w", l, err))
					continue
				}
				b.sample("stage_"+itoa(l)+"_relay", st.relay)
				b.sample("stage_"+itoa(l)+"_consumer", st.consumer)
				b.sample("stage_"+itoa(l)+"_inbox", st.inbox)
			}
			return errors.Join(errs...)
		})
	}
	if tunedMaxWait := b.cfg.TunedMaxWait; tunedMaxWait > 0 {
		l := b.cfg.Loads[0]
		for range b.cfg.Repeats {
			b.attempt(ctx, "end to end, tuned", latIDs("tuned"), func(ctx context.Context) error {
				p, err := b.startPipeline(ctx, tunedMaxWait)
				if err != nil {
					return err
				}
				defer p.close()
				r, err := p.run(ctx, max(1, int(float64(l)*b.cfg.LoadDuration.Seconds())), 1, max(w, 8), float64(l), b.cfg.LoadDuration)
				if err != nil {
					return err
				}
				recordLatency("tuned", r)
				return nil
			})
		}
		b.note("latency_tuned_p50", fmt.Sprintf("%d events/s offered, 1/tx, consumer --max-wait %s (default 500ms); everything else default", l, tunedMaxWait))
	}
	b.note("e2e_batch", fmt.Sprintf("%d events, %d producers × %d/tx via pgrelay.Enqueue; relay and consumer with default settings; first produce to last credit", n, w, b.cfg.BatchSize))
	b.note("e2e_one", fmt.Sprintf("%d events, %d producers × 1/tx via pgrelay.Enqueue", nOne, w))
	effect := "the observer's 1 ms ledger poll"
	if o, _ := b.observerFor(b.dbs); o == observerCommitTS {
		effect = "the credit's commit timestamp (track_commit_timestamp)"
	}
	for _, l := range b.cfg.Loads {
		if effect != "the observer's 1 ms ledger poll" {
			b.note("stage_"+itoa(l)+"_inbox", "inbox.received_at to the credit's commit timestamp: the consumer's transaction (store, apply) up to its commit record")
		}
		b.note("latency_"+itoa(l)+"_p50", fmt.Sprintf("%s of open-loop load, 1 event/tx; latency from the producer's commit to %s", b.cfg.LoadDuration, effect))
	}
}

// cpuIDs are the ids a run's CPU figures may have.
func cpuIDs(run string) []string {
	var ids []string
	for _, c := range []string{cpuRelay, cpuConsumer, cpuNATS, cpuPostgres, cpuBench, cpuOther, cpuBusy} {
		ids = append(ids, cpuFigureID(run, c))
	}
	return ids
}
