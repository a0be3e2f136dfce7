// The consumer's engine: it fetches deliveries from the subscriber, stores
// each fetched batch in the inbox in one transaction (deduplicated), commits,
// and only then acknowledges the batch; the inbox workers, in the same
// process, apply each event's side effect exactly once. A crash between the
// commit and the acknowledgement only causes a redelivery, which the inbox
// absorbs. A message the consumer cannot use is never dropped: it is stored
// dead with the reason and its raw bytes, then acknowledged.

package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/setting"
	"github.com/pgrelay/pgrelay/internal/wait"
)

type counters struct {
	fetched, inserted, duplicates, dead, acked, storeErrors, fetchErrors, conflicts, appliedOnReceive, unacked atomic.Int64
}

// newConsumer defaults and validates cfg and builds the consumer without
// its metrics (New adds them); every invalid setting is reported, each
// naming its Config field. It does not connect to anything yet.
func newConsumer(cfg Config) (*Consumer, error) {
	cfg = cfg.withDefaults()
	errs := cfg.validate()
	var w *pgrelay.InboxWorker
	if !cfg.disableWorkers {
		var err error
		if w, err = pgrelay.NewInboxWorker(cfg.Inbox); err != nil {
			// The inbox names its fields InboxConfig.X; here they are
			// consumer.Config.Inbox.X.
			setting.Each(err, func(fe *setting.FieldError) {
				fe.Pkg, fe.Struct, fe.Path = "", "consumer.Config", "Inbox."
			})
			errs = append(errs, err)
		}
	}
	if errs != nil {
		return nil, fmt.Errorf("consumer: %w", errors.Join(errs...))
	}
	return &Consumer{cfg: cfg, targets: cfg.targets(), log: cfg.Logger.With(slog.String("logger", "consumer")), worker: w,
		started: make(chan struct{})}, nil
}

// Stats returns a snapshot of the consumer's counters.
func (c *Consumer) Stats() Stats {
	return Stats{
		Fetched:     c.stats.fetched.Load(),
		Inserted:    c.stats.inserted.Load(),
		Duplicates:  c.stats.duplicates.Load(),
		Dead:        c.stats.dead.Load(),
		Acked:       c.stats.acked.Load(),
		StoreErrors: c.stats.storeErrors.Load(),
		FetchErrors: c.stats.fetchErrors.Load(),
		Conflicts:   c.stats.conflicts.Load(),

		AppliedOnReceive: c.stats.appliedOnReceive.Load(),
		Unacked:          c.stats.unacked.Load(),
	}
}

// dedupHitRatio returns the share of deliveries absorbed as duplicates over
// the last completed rate interval (Config.RateInterval) in which anything
// arrived: duplicates divided by messages stored or absorbed in it; 0 until
// then. A quiet interval keeps the last value rather than reading as 0.
func (c *Consumer) dedupHitRatio() float64 { return math.Float64frombits(c.hitRatio.Load()) }

// Ready reports whether the consumer's last fetch succeeded: it is attached
// to its broker and fetching.
func (c *Consumer) Ready() bool { return c.ready.Load() }

// consume runs the ingest and the inbox workers until ctx is cancelled,
// then shuts down gracefully: it stops fetching, stores and acknowledges the
// batches in hand, and stops the inbox workers. It returns nil after a
// graceful shutdown. Broker and database outages are retried with backoff,
// never returned; what a retry cannot fix is: a subscriber that cannot be
// created (Config.Subscribe fails: a broker that cannot be reached at
// start-up is reported with its cause) and a permanent fetch error
// (broker.IsTerminal: a setting to fix, such as a stream that outlives the
// dedup window).
func (c *Consumer) consume(ctx context.Context) error {
	// A fatal ingest error (a refused setting) stops the workers too.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var workerErr error
	if c.worker != nil {
		wg.Go(func() {
			if err := c.worker.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
				workerErr = fmt.Errorf("consumer: %w", err) // the inbox's errors name it already
			}
		})
	}
	if c.cfg.StatsInterval > 0 {
		wg.Go(func() { c.logStats(ctx) })
	}
	wg.Go(func() { c.watchDupRate(ctx) })
	err := c.ingest(ctx)
	cancel()
	wg.Wait()
	c.log.Info("consumer stopped", c.statsFields()...)
	return errors.Join(err, workerErr)
}

// ingest subscribes and moves batches into the inbox until ctx ends.
func (c *Consumer) ingest(ctx context.Context) error {
	if c.cfg.Direct {
		return c.direct(ctx)
	}
	sub, err := c.cfg.Subscribe(ctx)
	if err != nil {
		return fmt.Errorf("consumer: %w", err)
	}
	defer func() {
		if err := sub.Close(); err != nil {
			c.log.Warn("closing the subscriber failed", slog.Any("error", err))
		}
	}()
	defer c.ready.Store(false)
	c.log.Info("ingest started", slog.Int("batch_size", c.cfg.FetchBatchSize), slog.Duration("max_wait", c.cfg.MaxWait),
		slog.Int("ingest_loops", c.cfg.IngestLoops))
	// With one ingest loop this goroutine fetches, stores, commits and
	// acknowledges one batch at a time. With more, it only fetches
	// (Subscriber.Fetch is never called concurrently) and IngestLoops
	// goroutines store and acknowledge, each batch in its own transaction,
	// acknowledged after its own commit. A batch fetched while every loop is
	// busy waits in hand for the first free one, so at most IngestLoops+1
	// batches are out at once. The loops drain every batch handed over, on a
	// stop too, before ingest returns.
	if c.cfg.AsyncCommit {
		// Stopped after the ingest loops below (deferred later, run
		// earlier) and before the subscriber closes: the acknowledgements
		// waiting for their flush are sent on a graceful stop.
		c.acks = newAcker(c)
		go c.acks.run()
		defer c.acks.stop()
	}
	handOver := func(ds []broker.Delivery) { c.handle(ctx, ds) }
	if c.cfg.IngestLoops > 1 {
		batches := make(chan []broker.Delivery)
		var loops sync.WaitGroup
		for range c.cfg.IngestLoops {
			loops.Go(func() {
				for ds := range batches {
					c.handle(ctx, ds)
				}
			})
		}
		defer loops.Wait()
		defer close(batches)
		handOver = func(ds []broker.Delivery) { batches <- ds }
	}
	failures := 0
	for ctx.Err() == nil {
		ds, err := sub.Fetch(ctx, c.cfg.FetchBatchSize, c.cfg.MaxWait)
		c.stats.fetched.Add(int64(len(ds)))
		if err != nil {
			c.ready.Store(false)
			if perm := (*broker.TerminalError)(nil); errors.As(err, &perm) {
				// A setting to fix, not an outage to wait out.
				return fmt.Errorf("consumer: %w", perm.Err)
			}
			c.stats.fetchErrors.Add(1)
			c.log.Warn("fetch failed; retrying", slog.Any("error", err), slog.Int("attempt", failures+1))
		} else {
			c.ready.Store(true)
		}
		// Deliveries fetched before an error are stored too, and the batch
		// in hand is stored and acknowledged even when shutdown has begun:
		// that is what a graceful stop means.
		if len(ds) > 0 {
			handOver(ds)
		}
		if err != nil {
			if !c.sleep(ctx, failures) {
				break
			}
			failures++
		} else {
			failures = 0
		}
	}
	return nil
}

// handle stores a fetched batch in the inbox in one transaction and
// acknowledges it after the commit (with Config.AsyncCommit, hands it to the
// acker, which acknowledges it once the commit is flushed). Storing is
// retried until it succeeds or the consumer stops; unacknowledged deliveries
// are redelivered by the broker.
func (c *Consumer) handle(ctx context.Context, ds []broker.Delivery) {
	incoming := make([]pgrelay.Incoming, len(ds))
	for i, d := range ds {
		if d.DeadReason != "" {
			c.log.Warn("malformed message stored dead", slog.String("event_id", d.Message.EventID),
				slog.String("ref", d.Ref), slog.String("reason", d.DeadReason))
		}
		incoming[i] = pgrelay.Incoming{Message: d.Message, DeadReason: d.DeadReason}
	}
	acks := ds

	// Storing outlives cancellation: the batch in hand is finished on a
	// graceful stop. A stop during an outage gives up after one more attempt.
	sctx := context.WithoutCancel(ctx)
	apply := c.applyOnReceive(ds)
	var mark commitMark // the commits to be flushed before the acks (AsyncCommit)
	for attempt := 0; ; attempt++ {
		// A retry only stores: whatever failed the first attempt (a handler
		// that broke the connection, say) is left to the workers.
		err := c.store(sctx, incoming, apply && attempt == 0, &mark)
		if err == nil {
			break
		}
		c.stats.storeErrors.Add(1)
		if isRefused(err) {
			// One message the database refuses must not block the others:
			// store the batch one by one, dead if need be.
			c.log.Error("batch refused by the database; storing one by one", slog.Any("error", err))
			incoming = c.storeEach(ctx, sctx, incoming, acks, &mark)
			break
		}
		c.log.Warn("storing batch failed; retrying", slog.Any("error", err), slog.Int("messages", len(incoming)), slog.Int("attempt", attempt+1))
		if ctx.Err() != nil {
			c.log.Warn("stopping with a batch not stored; the broker will redeliver it", slog.Int("messages", len(incoming)))
			return
		}
		c.inProgress(sctx, acks) // keep the broker from redelivering while we retry
		if !c.sleep(ctx, attempt) {
			return
		}
	}
	if c.crashAfterCommit != nil && c.crashAfterCommit() {
		return
	}
	stored := acks[:0:0]
	for i, d := range acks {
		if incoming != nil && incoming[i].EventID == "" {
			continue // not stored (see storeEach)
		}
		stored = append(stored, d)
	}
	if c.acks != nil {
		c.acks.add(mark, stored)
		return
	}
	c.ackNow(stored)
}

// inProgress postpones the redelivery of ds while storing them is retried.
func (c *Consumer) inProgress(ctx context.Context, ds []broker.Delivery) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.storeTimeout)
	defer cancel()
	for _, d := range ds {
		_ = d.InProgress(ctx) // best effort: a redelivery is absorbed anyway
	}
}

// applyOnReceive reports whether a fetched batch is applied in the
// transaction that stores it (Config.NoApplyOnReceive): always, whatever the
// size of the fetch and whatever the workers are doing, when the broker says
// every delivery is a first delivery. Stored pending for the workers, an
// event is written three times (insert, claim, mark) where applying it on
// receive writes it once; and under a held xmin horizon every claim and mark
// leaves dead tuples the next claims walk. The workers only take what is left
// pending: a failed run on receive, a redelivery, rows of other handlers.
// Parallelism under a broker backlog comes from Config.IngestLoops.
//
// A run on receive counts no attempt (it commits with the store or not at
// all), so a message whose handler kills the process there comes back
// redelivered, is stored for the workers, and from then on each run is a
// counted attempt: a poison message reaches the dead letters after at most
// one uncounted run instead of killing the consumer forever.
func (c *Consumer) applyOnReceive(ds []broker.Delivery) bool {
	if c.cfg.NoApplyOnReceive || c.worker == nil {
		return false
	}
	for _, d := range ds {
		if !d.FirstDelivery {
			return false
		}
	}
	return true
}

// store writes one batch into the inbox in one transaction. With apply, the
// same transaction runs the handler on the events it stored
// (pgrelay.InboxWorker.ReceiveApply); the workers take whatever that leaves pending.
//
// With Config.AsyncCommit the transaction commits without waiting for the
// WAL flush and adds its commit to mark (see beginFunc).
func (c *Consumer) store(ctx context.Context, incoming []pgrelay.Incoming, apply bool, mark *commitMark) error {
	if c.beforeStore != nil {
		c.beforeStore(incoming)
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.storeTimeout)
	defer cancel()
	if c.worker != nil {
		// The rows stored are stamped with the transaction's start: the
		// workers' claims must not start their scan past them.
		defer c.worker.HoldClaimBound()()
	}
	var res pgrelay.ReceiveResult
	var applied *pgrelay.Applied
	err := c.beginFunc(ctx, mark, func(tx pgx.Tx) error {
		var err error
		opts := pgrelay.ReceiveOptions{Targets: c.targets, NoDuplicateRecord: c.cfg.noDuplicateRecord}
		if apply {
			res, applied, err = c.worker.ReceiveApply(ctx, tx, incoming, opts, c.cfg.observeReceive)
		} else {
			start := time.Now()
			res, err = pgrelay.ReceiveWith(ctx, tx, incoming, opts)
			if c.cfg.observeReceive != nil {
				c.cfg.observeReceive(time.Since(start))
			}
		}
		if err == nil && (res.Inserted > 0 || res.SeqsWoken > 0) && c.worker == nil {
			// The inbox workers run elsewhere: wake them at the commit.
			err = pgrelay.NotifyInbox(ctx, tx)
		}
		return err
	})
	if err != nil {
		return err
	}
	applied.Committed(ctx)
	c.stats.appliedOnReceive.Add(int64(applied.Len()))
	if (res.Inserted > applied.Len() || res.SeqsWoken > 0) && c.worker != nil {
		c.worker.Wake()
	}
	c.stats.inserted.Add(int64(res.Inserted))
	c.stats.duplicates.Add(int64(len(res.Duplicates)))
	var dead int64
	dups := make(map[string]bool, len(res.Duplicates))
	for _, id := range res.Duplicates {
		dups[id] = true
	}
	for _, in := range incoming {
		if in.DeadReason != "" && !dups[in.EventID] {
			dead++
		}
	}
	c.stats.dead.Add(dead)
	c.reportIdentity(res)
	if c.log.Enabled(ctx, slog.LevelDebug) {
		// The original's received_at is not logged: the insert that absorbs
		// the duplicate does not return the stored row, and reading it would
		// cost a query per batch.
		for _, id := range res.Duplicates {
			c.log.Debug("duplicate blocked", slog.String("event_id", id))
		}
	}
	return nil
}

// storeEach stores messages one at a time after the database refused their
// batch as data. Only a refusal as data dead-letters a message: it is then
// stored dead with the refusal as its reason and every field it has (text made
// storable where it was not). A transient failure (connection lost, failover,
// timeout) is retried with backoff, keeping the messages in progress, until it
// succeeds or the consumer stops. It returns incoming with the EventID of any
// message that was not stored cleared, so that it is left unacknowledged and
// the broker redelivers it.
func (c *Consumer) storeEach(ctx, sctx context.Context, incoming []pgrelay.Incoming, acks []broker.Delivery, mark *commitMark) []pgrelay.Incoming {
	out := make([]pgrelay.Incoming, len(incoming))
	copy(out, incoming)
	for i, in := range incoming {
		if !c.storeOne(ctx, sctx, in, acks[i:], mark) {
			out[i].EventID = ""
		}
	}
	return out
}

// storeOne stores one message of a refused batch, dead if the database refuses
// it as data, and reports whether it was stored. ctx ends the retries of
// transient failures (a stop); sctx is the store's own context.
func (c *Consumer) storeOne(ctx, sctx context.Context, in pgrelay.Incoming, pending []broker.Delivery, mark *commitMark) bool {
	msg := in
	refusals := 0
	for attempt := 0; ; {
		err := c.store(sctx, []pgrelay.Incoming{msg}, false, mark)
		if err == nil {
			return true
		}
		c.stats.storeErrors.Add(1)
		if isRefused(err) {
			refusals++
			switch refusals {
			case 1:
				msg = deadCopy(in, err, true)
			case 2:
				// Even the cleaned fields are refused: keep the id and the raw
				// payload, which are always storable.
				msg = deadCopy(in, err, false)
			default:
				c.stats.unacked.Add(1)
				c.log.Error("message refused even as a dead letter; left unacknowledged: the broker delivers it again "+
					"(NATS after its ack wait, RabbitMQ when the channel closes, Kafka after a rebalance or restart; "+
					"until then its Kafka partition's committed offset stays before it)",
					slog.String("event_id", in.EventID), slog.String("ref", ref(pending)), slog.Any("error", err))
				return false
			}
			continue
		}
		c.log.Warn("storing one message failed; retrying", slog.String("event_id", in.EventID),
			slog.Any("error", err), slog.Int("attempt", attempt+1))
		if ctx.Err() != nil {
			return false
		}
		c.inProgress(sctx, pending) // keep the broker from redelivering while we retry
		if !c.sleep(ctx, attempt) {
			return false
		}
		attempt++
	}
}

// ref names the first of pending's deliveries (the one being stored).
func ref(pending []broker.Delivery) string {
	if len(pending) == 0 {
		return ""
	}
	return pending[0].Ref
}

// deadCopy is in as a dead letter with the database's refusal as its reason.
// With keepFields, every field is kept, its text made storable (invalid UTF-8
// and NUL bytes replaced by U+FFFD); without, only the id, payload and
// occurred-at are.
func deadCopy(in pgrelay.Incoming, refusal error, keepFields bool) pgrelay.Incoming {
	reason := "refused at ingest: " + refusal.Error()
	if in.DeadReason != "" {
		reason = in.DeadReason + "; " + reason
	}
	m := pgrelay.Message{EventID: in.EventID, Payload: in.Payload, OccurredAt: in.OccurredAt, Headers: map[string]string{}}
	if keepFields {
		clean := func(s string) string { s, _ = broker.StorableText(s); return s }
		m.Topic, m.Key, m.EventType = clean(in.Topic), clean(in.Key), clean(in.EventType)
		m.ContentType = clean(in.ContentType)
		for k, v := range in.Headers {
			m.Headers[clean(k)] = clean(v)
		}
		if event.ValidateKey(m.Key) != nil {
			// No key index holds it: the row goes without it, its start kept.
			m.Headers[broker.RawKeyHeader] = broker.Truncate(broker.Printable(m.Key), 256)
			m.Key = ""
		}
		if m.Key != "" && in.KeySeq > 0 {
			// The dead row keeps its place in its key's sequence: in ordered
			// mode it parks the key (visible, skippable with dead skip)
			// instead of leaving a gap.
			m.KeySeq = in.KeySeq
		}
	}
	return pgrelay.Incoming{Message: m, DeadReason: broker.Printable(broker.Truncate(reason, 2000))}
}

// isRefused reports whether the batch itself was refused, by pgrelay.Receive's
// checks or by the database as data (class 22 data exception, class 23
// constraint violation, class 54 program limit exceeded: an index entry too
// large for its btree, say), as opposed to the database being unreachable:
// retrying would not help.
func isRefused(err error) bool {
	var inv *pgrelay.InvalidMessageError
	if errors.As(err, &inv) {
		return true
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || len(pgErr.Code) != 5 {
		return false
	}
	switch pgErr.Code[:2] {
	case "22", "23", "54":
		return true
	}
	return false
}

// sleep waits for the attempt's backoff (attempt from 0: exponential from
// RetryMin, capped at RetryMax, ×0.5–1.5) or until ctx ends, and reports
// whether ctx is still live.
func (c *Consumer) sleep(ctx context.Context, attempt int) bool {
	p := wait.Policy{Min: c.cfg.RetryMin, Max: c.cfg.RetryMax, Spread: 0.5}
	return wait.Sleep(ctx, p.Delay(attempt+1))
}

func (c *Consumer) logStats(ctx context.Context) {
	_ = wait.Tick(ctx, c.cfg.StatsInterval, func() error {
		c.log.Info("consumer stats", c.statsFields()...)
		return nil
	})
}

// watchDupRate computes the dedup hit ratio every rate interval and warns
// when it is above Config.DupRateWarn.
func (c *Consumer) watchDupRate(ctx context.Context) {
	_ = wait.Tick(ctx, c.cfg.rateInterval, func() error {
		c.closeRateInterval()
		return nil
	})
}

// rateCounts are the stored and duplicate counts at the end of the last rate
// interval. Both are taken when a batch is stored, so that a batch never
// straddles two intervals.
type rateCounts struct{ stored, dups int64 }

// closeRateInterval ends a rate interval: it sets the hit ratio from what
// arrived since the last one (keeping the last ratio when nothing did) and
// warns when it is above Config.DupRateWarn. Only watchDupRate calls it.
func (c *Consumer) closeRateInterval() {
	stored, dups := c.stats.inserted.Load(), c.stats.duplicates.Load()
	dd := dups - c.rateLast.dups
	df := stored - c.rateLast.stored + dd
	c.rateLast = rateCounts{stored: stored, dups: dups}
	if df == 0 {
		return // nothing arrived: the ratio stays the last one measured
	}
	ratio := float64(dd) / float64(df)
	c.hitRatio.Store(math.Float64bits(ratio))
	if c.cfg.DupRateWarn > 0 && ratio > c.cfg.DupRateWarn {
		c.log.Warn("high duplicate rate",
			slog.Float64("rate", ratio), slog.Float64("threshold", c.cfg.DupRateWarn),
			slog.Int64("duplicates", dd), slog.Int64("delivered", df),
			slog.Duration("interval", c.cfg.rateInterval))
	}
}

func (c *Consumer) statsFields() []any {
	s := c.Stats()
	return []any{
		slog.Int64("fetched", s.Fetched), slog.Int64("inserted", s.Inserted),
		slog.Int64("duplicates", s.Duplicates), slog.Int64("dead_at_ingest", s.Dead),
		slog.Int64("acked", s.Acked), slog.Int64("store_errors", s.StoreErrors),
		slog.Int64("fetch_errors", s.FetchErrors), slog.Int64("applied_on_receive", s.AppliedOnReceive),
		slog.Int64("unacked", s.Unacked),
	}
}

// direct registers the targets for the relay that stores into this
// database's inbox (Config.Direct), retrying while the database is down,
// then waits for ctx to end: the workers do the rest.
func (c *Consumer) direct(ctx context.Context) error {
	for attempt := 0; ; attempt++ {
		rctx, cancel := context.WithTimeout(ctx, c.cfg.storeTimeout)
		err := c.cfg.Register(rctx)
		cancel()
		if err == nil {
			break
		}
		c.log.Warn("registering the handlers in pgrelay.inbox_subscriptions failed; retrying", slog.Any("error", err), slog.Int("attempt", attempt+1))
		if !c.sleep(ctx, attempt) {
			return nil
		}
	}
	handlers := make([]string, len(c.targets))
	for i, t := range c.targets {
		handlers[i] = t.Handler
	}
	c.log.Info("direct: the relay stores into this inbox; running the workers only", slog.Any("handlers", handlers))
	c.ready.Store(true)
	defer c.ready.Store(false)
	<-ctx.Done()
	return nil
}
