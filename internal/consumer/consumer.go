// Package consumer is the consumer service: it pulls messages from a
// JetStream durable consumer, stores each fetched batch in the inbox in one
// transaction (deduplicated by event id), commits, and only then acknowledges
// the batch. The inbox workers, running in the same process, then apply each
// event's side effect exactly once.
//
// A crash between the commit and the acknowledgement only causes a
// redelivery, which the inbox absorbs. A message the consumer cannot use is
// never dropped: it is stored dead with the reason and its raw bytes, then
// acknowledged.
package consumer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/pgrelay/pgrelay/internal/broker"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/inbox"
)

// Consumer moves messages from JetStream into the inbox and runs the inbox
// workers. Create it with New and start it with Run.
type Consumer struct {
	cfg    Config
	log    *zap.Logger
	worker *inbox.Worker // nil when Config.DisableWorkers
	stats  counters
	ready  atomic.Bool
	// hitRatio holds the float64 bits of the dedup hit ratio over the last
	// completed rate interval (see DedupHitRatio).
	hitRatio atomic.Uint64
	// rateLast is closeRateInterval's state (the counts at the last interval's
	// end); only the rate watcher touches it.
	rateLast rateCounts
	// streamCreated is the attached stream's creation time, part of the
	// fallback id of a message without an event id. Only the ingest
	// goroutine reads and writes it.
	streamCreated time.Time

	// crashAfterCommit, when set (tests only), is called after a batch
	// committed and before it is acknowledged; returning true abandons the
	// batch unacknowledged, as a process crash at that point would.
	crashAfterCommit func() bool
	// beforeStore, when set (tests only), is called before each attempt to
	// store messages, so a test can break the database connection there.
	beforeStore func([]inbox.Incoming)
}

// Stats are the consumer's running counters since it started.
type Stats struct {
	// Fetched counts messages fetched from JetStream, redeliveries included.
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
}

type counters struct {
	fetched, inserted, duplicates, dead, acked, storeErrors, fetchErrors, conflicts atomic.Int64
}

// New validates cfg (after WithDefaults) and builds a consumer. It does not
// connect to anything yet: Run does, and keeps retrying.
func New(cfg Config) (*Consumer, error) {
	cfg = cfg.WithDefaults()
	errs := cfg.validate()
	var w *inbox.Worker
	if !cfg.DisableWorkers {
		var err error
		if w, err = inbox.NewWorker(cfg.Inbox); err != nil {
			// The inbox names its own fields "inbox: Config.X"; here they
			// are Config.Inbox.X, which tells them from the consumer's own.
			msg := strings.ReplaceAll(err.Error(), "inbox: Config.", "Config.")
			errs = errors.Join(errs, errors.New(strings.ReplaceAll(msg, "Config.", "Config.Inbox.")))
		}
	}
	if errs != nil {
		return nil, fmt.Errorf("consumer: %w", errs)
	}
	c := &Consumer{cfg: cfg, log: cfg.Logger.Named("consumer"), worker: w}
	return c, nil
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
	}
}

// DedupHitRatio returns the share of deliveries absorbed as duplicates over
// the last completed rate interval (Config.RateInterval) in which anything
// arrived: duplicates divided by messages stored or absorbed in it; 0 until
// then. A quiet interval keeps the last value rather than reading as 0.
func (c *Consumer) DedupHitRatio() float64 { return math.Float64frombits(c.hitRatio.Load()) }

// Ready reports whether the consumer is attached to its JetStream consumer
// and fetching.
func (c *Consumer) Ready() bool { return c.ready.Load() }

// Run consumes until ctx is cancelled, then shuts down gracefully: it stops
// fetching, stores and acknowledges the batch in hand, and stops the inbox
// workers. It returns nil after a graceful shutdown. Broker and database
// outages are retried with backoff, never returned; what a retry cannot fix
// is: a NATS server that cannot be reached at start-up (the first connection
// is not retried, so a wrong URL is reported with its cause) and a stream that
// outlives the dedup window (*ReplayWindowError).
func (c *Consumer) Run(ctx context.Context) error {
	// A fatal ingest error (a refused stream) stops the workers too.
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

// ingest connects to NATS and moves batches into the inbox until ctx ends.
func (c *Consumer) ingest(ctx context.Context) error {
	// The first connection is not retried: a wrong or unreachable URL at
	// start-up is a setting to fix, reported at once with its cause. Once
	// connected, the client reconnects forever.
	dialer := &recordingDialer{Dialer: net.Dialer{Timeout: nats.DefaultTimeout}}
	nc, err := nats.Connect(c.cfg.NATSURL,
		nats.Name("pgrelay-consumer"),
		nats.SetCustomDialer(dialer),
		nats.RetryOnFailedConnect(false),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			c.log.Warn("disconnected from NATS", zap.Error(err))
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			c.log.Info("reconnected to NATS", zap.String("url", nc.ConnectedUrlRedacted()))
		}),
	)
	if err != nil {
		if cause := dialer.lastError(); cause != nil {
			err = fmt.Errorf("%w (%v)", err, cause)
		}
		return fmt.Errorf("consumer: cannot connect to NATS at Config.NATSURL %s: %w", redactURLs(c.cfg.NATSURL), err)
	}
	defer func() {
		_ = nc.FlushTimeout(2 * time.Second) // the last batch's acks
		nc.Close()
	}()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("consumer: jetstream: %w", err)
	}

	defer c.ready.Store(false)
	var cons jetstream.Consumer
	failures := 0
	for ctx.Err() == nil {
		if cons == nil {
			if cons, err = c.attachRetrying(ctx, nc, js); err != nil {
				return fmt.Errorf("consumer: %w", err)
			}
			if cons == nil {
				return nil
			}
		}
		msgs, err := c.fetch(ctx, cons)
		if err != nil {
			c.stats.fetchErrors.Add(1)
			c.log.Warn("fetch failed; retrying", zap.Error(err))
			if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrConsumerDeleted) ||
				errors.Is(err, jetstream.ErrStreamNotFound) {
				// The durable consumer (or its stream) is gone, for example
				// deleted by an operator or lost with a memory-backed server:
				// attach again rather than fetch from nothing forever.
				c.ready.Store(false)
				cons = nil
			}
			if !c.sleep(ctx, failures) {
				break
			}
			failures++
		} else {
			failures = 0
		}
		if len(msgs) == 0 {
			continue
		}
		// The batch in hand is stored and acknowledged even when shutdown has
		// begun: that is what a graceful stop means.
		c.handle(ctx, msgs)
	}
	return nil
}

// attachRetrying attaches with backoff until it succeeds or ctx ends (then it
// returns a nil consumer and no error).
func (c *Consumer) attachRetrying(ctx context.Context, nc *nats.Conn, js jetstream.JetStream) (jetstream.Consumer, error) {
	for attempt := 0; ; attempt++ {
		cons, err := c.attach(ctx, js)
		if err == nil {
			c.ready.Store(true)
			c.log.Info("consuming",
				zap.String("stream", c.cfg.Stream), zap.String("durable", c.cfg.Durable),
				zap.String("filter", c.cfg.FilterSubject), zap.Int("batch_size", c.cfg.BatchSize))
			return cons, nil
		}
		if ctx.Err() != nil {
			return nil, nil
		}
		var rw *ReplayWindowError
		if errors.As(err, &rw) {
			return nil, err // a setting to fix, not an outage to wait out
		}
		switch {
		case !nc.IsConnected():
			c.log.Warn("not connected to NATS; retrying", zap.String("nats_url", redactURLs(c.cfg.NATSURL)),
				zap.String("status", nc.Status().String()), zap.NamedError("cause", nc.LastError()), zap.Int("attempt", attempt+1))
		case errors.Is(err, jetstream.ErrStreamNotFound):
			c.log.Warn("stream not found; waiting for the relay to create it (or set --create-stream)",
				zap.String("stream", c.cfg.Stream), zap.String("nats_url", redactURLs(c.cfg.NATSURL)), zap.Int("attempt", attempt+1))
		default:
			c.log.Warn("cannot attach to the JetStream consumer yet; retrying", zap.String("nats_url", redactURLs(c.cfg.NATSURL)),
				zap.Error(err), zap.Int("attempt", attempt+1))
		}
		if !c.sleep(ctx, attempt) {
			return nil, nil
		}
	}
}

// attach finds (or creates) the stream, checks that it cannot replay an event
// past the dedup window, and creates or updates the durable pull consumer.
func (c *Consumer) attach(ctx context.Context, js jetstream.JetStream) (jetstream.Consumer, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var info *jetstream.StreamInfo
	if c.cfg.CreateStream {
		var err error
		if info, err = broker.EnsureStream(ctx, js, c.streamSpec(), c.log); err != nil {
			return nil, err
		}
	} else {
		s, err := js.Stream(ctx, c.cfg.Stream)
		if err != nil {
			return nil, fmt.Errorf("stream %q: %w", c.cfg.Stream, err)
		}
		info = s.CachedInfo()
	}
	if err := c.checkReplayWindow(info.Config); err != nil {
		return nil, err
	}
	c.streamCreated = info.Created
	cfg := jetstream.ConsumerConfig{
		Durable:       c.cfg.Durable,
		FilterSubject: c.cfg.FilterSubject,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       c.cfg.AckWait,
		// Unlimited redeliveries: JetStream would otherwise drop a message
		// silently after MaxDeliver attempts, and nothing may be lost.
		MaxDeliver:    -1,
		MaxAckPending: c.cfg.MaxAckPending,
	}
	existing, err := js.Consumer(ctx, c.cfg.Stream, c.cfg.Durable)
	switch {
	case err == nil:
		// Where it delivers from is fixed at creation.
		cfg.DeliverPolicy, cfg.OptStartTime = existing.CachedInfo().Config.DeliverPolicy, existing.CachedInfo().Config.OptStartTime
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		// A new durable, or one that was lost: deliver from now minus the
		// dedup window, never from the start of the stream. An older message
		// may be an event processed so long ago that retention deleted its
		// inbox row, and a replay would apply it again.
		from := time.Now().Add(-c.cfg.DedupWindow)
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &from
		c.log.Info("creating the durable consumer, delivering messages stored since now minus the dedup window",
			zap.String("durable", c.cfg.Durable), zap.Time("from", from), zap.Duration("dedup_window", c.cfg.DedupWindow))
	default:
		return nil, fmt.Errorf("durable consumer %q on stream %q: %w", c.cfg.Durable, c.cfg.Stream, err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, c.cfg.Stream, cfg)
	if err != nil {
		return nil, fmt.Errorf("durable consumer %q on stream %q: %w", c.cfg.Durable, c.cfg.Stream, err)
	}
	return cons, nil
}

// ReplayWindowError is the refusal of a stream that can deliver an event
// again after its inbox row left the dedup window.
type ReplayWindowError struct {
	Stream string
	// MaxAge is the stream's MaxAge (zero: no limit), Duplicates its duplicate
	// window, DedupWindow the inbox's.
	MaxAge, Duplicates, DedupWindow time.Duration
}

func (e *ReplayWindowError) Error() string {
	maxAge := "unlimited"
	if e.MaxAge > 0 {
		maxAge = e.MaxAge.String()
	}
	return fmt.Sprintf("stream %s keeps messages for MaxAge %s (duplicate window %s), "+
		"longer than the inbox dedup window Config.DedupWindow %s: a replay of the stream (a lost durable consumer, a new one) "+
		"could deliver events whose inbox rows retention already deleted, and apply them again. "+
		"Give the stream a MaxAge within the window (the relay's --stream-max-age for a stream it creates, or "+
		"nats stream edit %s --max-age), raise Config.DedupWindow, or accept the risk with "+
		"Config.AllowReplayBeyondDedupWindow", e.Stream, maxAge, e.Duplicates, e.DedupWindow, e.Stream)
}

// checkReplayWindow refuses a stream whose messages (MaxAge, zero meaning
// forever) or duplicate window outlive the dedup window, unless
// AllowReplayBeyondDedupWindow is set; then it only warns.
func (c *Consumer) checkReplayWindow(sc jetstream.StreamConfig) error {
	if sc.MaxAge > 0 && sc.MaxAge <= c.cfg.DedupWindow && sc.Duplicates <= c.cfg.DedupWindow {
		return nil
	}
	err := &ReplayWindowError{Stream: sc.Name, MaxAge: sc.MaxAge, Duplicates: sc.Duplicates, DedupWindow: c.cfg.DedupWindow}
	if !c.cfg.AllowReplayBeyondDedupWindow {
		return err
	}
	c.log.Warn("replays beyond the dedup window allowed", zap.String("risk", err.Error()))
	return nil
}

// streamSpec is the stream the consumer creates when CreateStream is set: the
// relay's settings, with a MaxAge that stays within the dedup window.
func (c *Consumer) streamSpec() broker.StreamSpec {
	return broker.StreamSpec{Name: c.cfg.Stream, SubjectPrefix: c.cfg.SubjectPrefix,
		MaxAge: min(broker.DefaultStreamMaxAge, c.cfg.DedupWindow)}
}

// fetch pulls one batch: whatever is available at once, up to BatchSize.
// When nothing is, it waits up to MaxWait for the first message and then takes
// whatever else is available, so a lone message is stored at once instead of
// waiting for a full batch. The waits are pull-request expiries on the server
// (FetchMaxWait), not client deadlines: a client that gave up before the server
// would leave the messages delivered in between unacknowledged until AckWait.
// A stop therefore waits for the fetch in progress (at most MaxWait); messages
// received before an error are returned with it.
func (c *Consumer) fetch(ctx context.Context, cons jetstream.Consumer) ([]jetstream.Msg, error) {
	msgs, err := c.pull(ctx, func() (jetstream.MessageBatch, error) { return cons.FetchNoWait(c.cfg.BatchSize) }, nil)
	if err != nil || len(msgs) > 0 {
		return msgs, err
	}
	msgs, err = c.pull(ctx, func() (jetstream.MessageBatch, error) {
		return cons.Fetch(1, jetstream.FetchMaxWait(c.cfg.MaxWait))
	}, nil)
	if err != nil || len(msgs) == 0 || c.cfg.BatchSize == 1 {
		return msgs, err
	}
	return c.pull(ctx, func() (jetstream.MessageBatch, error) { return cons.FetchNoWait(c.cfg.BatchSize - 1) }, msgs)
}

// pull runs one fetch request and appends its messages to msgs. The end of a
// request's wait, or an empty stream, is not an error.
func (c *Consumer) pull(ctx context.Context, request func() (jetstream.MessageBatch, error), msgs []jetstream.Msg) ([]jetstream.Msg, error) {
	batch, err := request()
	if err != nil {
		if ctx.Err() != nil {
			return msgs, nil
		}
		return msgs, err
	}
	n := len(msgs)
	for m := range batch.Messages() {
		msgs = append(msgs, m)
	}
	c.stats.fetched.Add(int64(len(msgs) - n))
	switch err := batch.Error(); {
	case err == nil, ctx.Err() != nil,
		errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled),
		errors.Is(err, nats.ErrTimeout), errors.Is(err, jetstream.ErrNoMessages):
		return msgs, nil
	default:
		return msgs, err
	}
}

// handle decodes a fetched batch, stores it in the inbox in one transaction
// and acknowledges it after the commit. Storing is retried until it succeeds
// or the consumer stops; unacknowledged messages are redelivered by JetStream.
func (c *Consumer) handle(ctx context.Context, msgs []jetstream.Msg) {
	opts := DecodeOptions{SubjectPrefix: c.cfg.SubjectPrefix, MaxPayloadBytes: c.cfg.MaxPayloadBytes}
	incoming := make([]inbox.Incoming, 0, len(msgs))
	acks := make([]jetstream.Msg, 0, len(msgs))
	for _, m := range msgs {
		d := Delivery{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()}
		if meta, err := m.Metadata(); err == nil {
			d.Stream, d.StreamSeq, d.Timestamp = meta.Stream, meta.Sequence.Stream, meta.Timestamp
			if meta.Stream == c.cfg.Stream {
				d.StreamCreated = c.streamCreated
			}
		}
		dec := Decode(d, opts)
		if d.StreamSeq == 0 && dec.DeadReason != "" {
			// Without a stream position a broken message has no stable id;
			// leave it unacknowledged rather than store it under a guess.
			c.log.Error("message without JetStream metadata left unacknowledged", zap.String("subject", d.Subject), zap.String("reason", dec.DeadReason))
			continue
		}
		if dec.DeadReason != "" {
			c.log.Warn("malformed message stored dead",
				zap.String("event_id", dec.Message.EventID), zap.String("subject", d.Subject),
				zap.Uint64("stream_seq", d.StreamSeq), zap.String("reason", dec.DeadReason))
		}
		incoming = append(incoming, inbox.Incoming{Message: dec.Message, DeadReason: dec.DeadReason})
		acks = append(acks, m)
	}
	if len(incoming) == 0 {
		return
	}

	// Storing outlives cancellation: the batch in hand is finished on a
	// graceful stop. A stop during an outage gives up after one more attempt.
	sctx := context.WithoutCancel(ctx)
	for attempt := 0; ; attempt++ {
		err := c.store(sctx, incoming)
		if err == nil {
			break
		}
		c.stats.storeErrors.Add(1)
		if isRefused(err) {
			// One message the database refuses must not block the others:
			// store the batch one by one, dead if need be.
			c.log.Error("batch refused by the database; storing one by one", zap.Error(err))
			incoming = c.storeEach(ctx, sctx, incoming, acks)
			break
		}
		c.log.Warn("storing batch failed; retrying", zap.Error(err), zap.Int("messages", len(incoming)), zap.Int("attempt", attempt+1))
		if ctx.Err() != nil {
			c.log.Warn("stopping with a batch not stored; JetStream will redeliver it", zap.Int("messages", len(incoming)))
			return
		}
		for _, m := range acks {
			_ = m.InProgress() // keep JetStream from redelivering while we retry
		}
		if !c.sleep(ctx, attempt) {
			return
		}
	}
	if c.crashAfterCommit != nil && c.crashAfterCommit() {
		return
	}
	for i, m := range acks {
		if incoming != nil && incoming[i].EventID == "" {
			continue // not stored (see storeEach)
		}
		if err := m.Ack(); err != nil {
			// Harmless: the redelivery is absorbed by the inbox.
			c.log.Warn("ack failed; the message will be redelivered and deduplicated", zap.Error(err))
			continue
		}
		c.stats.acked.Add(1)
	}
}

// store writes one batch into the inbox in one transaction.
func (c *Consumer) store(ctx context.Context, incoming []inbox.Incoming) error {
	if c.beforeStore != nil {
		c.beforeStore(incoming)
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.StoreTimeout)
	defer cancel()
	var res inbox.ReceiveResult
	err := pgx.BeginFunc(ctx, c.cfg.Pool, func(tx pgx.Tx) error {
		var err error
		start := time.Now()
		res, err = inbox.ReceiveFor(ctx, tx, c.cfg.Targets, incoming)
		if c.cfg.ObserveReceive != nil {
			c.cfg.ObserveReceive(time.Since(start))
		}
		if err == nil && res.Inserted > 0 && c.worker == nil {
			// The inbox workers run elsewhere: wake them at the commit.
			err = inbox.Notify(ctx, tx)
		}
		return err
	})
	if err != nil {
		return err
	}
	if res.Inserted > 0 && c.worker != nil {
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
	if ce := c.log.Check(zap.DebugLevel, "duplicate blocked"); ce != nil {
		// The original's received_at is not logged: the insert that absorbs
		// the duplicate does not return the stored row, and reading it would
		// cost a query per batch.
		for _, id := range res.Duplicates {
			c.log.Debug("duplicate blocked", zap.String("event_id", id))
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
// JetStream redelivers it.
func (c *Consumer) storeEach(ctx, sctx context.Context, incoming []inbox.Incoming, acks []jetstream.Msg) []inbox.Incoming {
	out := make([]inbox.Incoming, len(incoming))
	copy(out, incoming)
	for i, in := range incoming {
		if !c.storeOne(ctx, sctx, in, acks[i:]) {
			out[i].EventID = ""
		}
	}
	return out
}

// storeOne stores one message of a refused batch, dead if the database refuses
// it as data, and reports whether it was stored. ctx ends the retries of
// transient failures (a stop); sctx is the store's own context.
func (c *Consumer) storeOne(ctx, sctx context.Context, in inbox.Incoming, pending []jetstream.Msg) bool {
	msg := in
	refusals := 0
	for attempt := 0; ; {
		err := c.store(sctx, []inbox.Incoming{msg})
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
				c.log.Error("message refused even as a dead letter; left unacknowledged",
					zap.String("event_id", in.EventID), zap.Error(err))
				return false
			}
			continue
		}
		c.log.Warn("storing one message failed; retrying", zap.String("event_id", in.EventID),
			zap.Error(err), zap.Int("attempt", attempt+1))
		if ctx.Err() != nil {
			return false
		}
		for _, m := range pending {
			if m != nil {
				_ = m.InProgress() // keep JetStream from redelivering while we retry
			}
		}
		if !c.sleep(ctx, attempt) {
			return false
		}
		attempt++
	}
}

// deadCopy is in as a dead letter with the database's refusal as its reason.
// With keepFields, every field is kept, its text made storable (invalid UTF-8
// and NUL bytes replaced by U+FFFD); without, only the id, payload and
// occurred-at are.
func deadCopy(in inbox.Incoming, refusal error, keepFields bool) inbox.Incoming {
	reason := "refused at ingest: " + refusal.Error()
	if in.DeadReason != "" {
		reason = in.DeadReason + "; " + reason
	}
	m := event.Message{EventID: in.EventID, Payload: in.Payload, OccurredAt: in.OccurredAt, Headers: map[string]string{}}
	if keepFields {
		clean := func(s string) string { s, _ = cleanText(s); return s }
		m.Topic, m.Key, m.EventType = clean(in.Topic), clean(in.Key), clean(in.EventType)
		m.ContentType = clean(in.ContentType)
		for k, v := range in.Headers {
			m.Headers[clean(k)] = clean(v)
		}
	}
	return inbox.Incoming{Message: m, DeadReason: printable(truncate(reason, 2000))}
}

// isRefused reports whether the batch itself was refused, by inbox.Receive's
// checks or by the database (a data exception or constraint violation), as
// opposed to the database being unreachable: retrying would not help.
func isRefused(err error) bool {
	var inv *inbox.InvalidMessageError
	if errors.As(err, &inv) {
		return true
	}
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && len(pgErr.Code) == 5 && (pgErr.Code[:2] == "22" || pgErr.Code[:2] == "23")
}

// recordingDialer dials like the NATS client's default dialer and keeps the
// last failure, which the client itself reports only as "no servers
// available".
type recordingDialer struct {
	net.Dialer
	mu   sync.Mutex
	last error
}

func (d *recordingDialer) Dial(network, address string) (net.Conn, error) {
	conn, err := d.Dialer.Dial(network, address)
	if err != nil {
		d.mu.Lock()
		d.last = err
		d.mu.Unlock()
	}
	return conn, err
}

func (d *recordingDialer) lastError() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.last
}

// redactURLs returns a comma-separated list of server URLs with any password
// replaced by "xxxxx", for messages.
func redactURLs(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if u, err := url.Parse(p); err == nil && u.User != nil {
			p = u.Redacted()
		}
		parts[i] = p
	}
	return strings.Join(parts, ",")
}

// sleep waits for the attempt's backoff (exponential, with jitter, capped) or
// until ctx ends, and reports whether ctx is still live.
func (c *Consumer) sleep(ctx context.Context, attempt int) bool {
	d := c.cfg.RetryMin << min(attempt, 20)
	if d > c.cfg.RetryMax || d <= 0 {
		d = c.cfg.RetryMax
	}
	d = d/2 + rand.N(d/2+1)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func (c *Consumer) logStats(ctx context.Context) {
	t := time.NewTicker(c.cfg.StatsInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.log.Info("consumer stats", c.statsFields()...)
		}
	}
}

// watchDupRate computes the dedup hit ratio every rate interval and warns
// when it is above Config.DupRateWarn.
func (c *Consumer) watchDupRate(ctx context.Context) {
	t := time.NewTicker(c.cfg.RateInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.closeRateInterval()
		}
	}
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
			zap.Float64("rate", ratio), zap.Float64("threshold", c.cfg.DupRateWarn),
			zap.Int64("duplicates", dd), zap.Int64("delivered", df),
			zap.Duration("interval", c.cfg.RateInterval))
	}
}

func (c *Consumer) statsFields() []zap.Field {
	s := c.Stats()
	return []zap.Field{
		zap.Int64("fetched", s.Fetched), zap.Int64("inserted", s.Inserted),
		zap.Int64("duplicates", s.Duplicates), zap.Int64("dead_at_ingest", s.Dead),
		zap.Int64("acked", s.Acked), zap.Int64("store_errors", s.StoreErrors),
		zap.Int64("fetch_errors", s.FetchErrors),
	}
}
