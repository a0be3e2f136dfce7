package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/internal/logbridge"
	"github.com/pgrelay/pgrelay/internal/rounds"
	"github.com/pgrelay/pgrelay/internal/setting"
)

// Publisher publishes to Kafka as an idempotent producer with acks from all
// in-sync replicas. Each event goes to "<TopicPrefix>.<topic>" with its key as
// the record key, so that a key's events share one partition, in order.
//
// Kafka's idempotence removes the duplicates the producer's own retries would
// make (lost acknowledgements, leader changes, producer epoch bumps); it
// cannot recognise an event published again by a later producer (after a
// relay crash between publish and mark), so Result.Duplicate is never set:
// those copies reach the inbox, whose event-id key absorbs them.
type Publisher struct {
	cfg Config
	cl  *kgo.Client
	log *slog.Logger
	// slots bounds the keys in flight (one record each) to MaxInFlight.
	slots chan struct{}
}

var _ broker.Publisher = (*Publisher)(nil)

// NewPublisher validates cfg (after WithDefaults), connects and checks that a
// broker answers, so that a wrong Config.Brokers fails at start-up.
func NewPublisher(ctx context.Context, cfg Config) (*Publisher, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := logbridge.Or(cfg.Logger).With(slog.String("logger", "kafka"))
	opts := append(commonOpts(cfg, log),
		kgo.RequiredAcks(kgo.AllISRAcks()), // idempotence needs it, and a record acknowledged by one replica only can be lost
		kgo.MaxBufferedRecords(cfg.MaxInFlight),
		kgo.ProducerBatchMaxBytes(int32(cfg.MaxMessageBytes)),
		kgo.UnknownTopicRetries(cfg.UnknownTopicRetries),
		kgo.RecordDeliveryTimeout(cfg.DeliveryTimeout),
		kgo.ProducerLinger(0),
		// Not StopProducerOnDataLossDetected: after a fenced or unknown
		// producer epoch the producer takes a new one and sends again.
		//
		// A record in flight may fail at DeliveryTimeout (or ctx's end)
		// instead of being awaited for ever: Publish reports the outage and
		// the client holds no stale records. Such a record may still have
		// been stored; the relay's retry is then a duplicate, which the inbox
		// absorbs. Order holds, since a key's next event is sent only once
		// the previous one is acknowledged.
		kgo.AllowIdempotentProduceCancellation(),
	)
	switch {
	case cfg.ProducerRetries < 0:
		opts = append(opts, kgo.RecordRetries(0))
	case cfg.ProducerRetries > 0:
		opts = append(opts, kgo.RecordRetries(cfg.ProducerRetries))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka: producer: %w", err)
	}
	if err := ping(ctx, cl, cfg); err != nil {
		cl.Close()
		return nil, err
	}
	return &Publisher{cfg: cfg, cl: cl, log: log, slots: make(chan struct{}, cfg.MaxInFlight)}, nil
}

// commonOpts are the client options the publisher and subscriber share.
func commonOpts(cfg Config, log *slog.Logger) []kgo.Opt {
	opts := []kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ClientID(cfg.ClientID),
		kgo.DialTimeout(cfg.DialTimeout),
		kgo.MetadataMaxAge(cfg.MetadataMaxAge),
		// Refreshes may come as often as every second: an unknown topic is
		// looked up again UnknownTopicRetries times before it is refused.
		kgo.MetadataMinAge(min(time.Second, cfg.MetadataMaxAge)),
		kgo.WithLogger(kgoLogger{log}),
	}
	if cfg.Dial != nil {
		opts = append(opts, kgo.Dialer(cfg.Dial))
	}
	return opts
}

// ping checks that a seed broker answers within DialTimeout.
func ping(ctx context.Context, cl *kgo.Client, cfg Config) error {
	pctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	defer cancel()
	if err := cl.Ping(pctx); err != nil {
		return setting.Errorf("kafka", "kafka.Config", "Brokers", "no broker of {} %s answers: %w", strings.Join(cfg.Brokers, ","), err)
	}
	return nil
}

// Client returns the underlying franz-go client.
func (p *Publisher) Client() *kgo.Client { return p.cl }

// Ping reports whether a broker answers (a readiness check).
func (p *Publisher) Ping(ctx context.Context) error { return p.cl.Ping(ctx) }

// Publish implements broker.Publisher. Keys are published concurrently, up to
// MaxInFlight at a time; the events of one key are sent one after another,
// each once the previous one is acknowledged, and a key's remaining events are
// not sent after a transient failure. So a later event of a key is never
// stored while an earlier one failed: the relay retries from the failed one,
// in order.
//
// One key is not pipelined because the producer cannot promise it: when a
// record fails, the producer fails the records buffered behind it on its
// partition, but a record handed over in the instant after that failure and
// before its report would start a fresh buffer and be stored ahead of the
// failed one.
//
// It runs on the caller's goroutine, in rounds (internal/rounds): each round
// hands every key's next record to the producer, as many keys as
// MaxInFlight leaves room for, then awaits their acknowledgements.
func (p *Publisher) Publish(ctx context.Context, msgs []pgrelay.Message) []broker.Result {
	return rounds.Publish(msgs, func(i int, mayBlock bool) rounds.Await {
		return p.start(ctx, msgs[i], mayBlock)
	})
}

// start hands m's record to the producer and returns what awaits its
// acknowledgement, or nil when MaxInFlight keys are in flight and mayBlock
// is false.
func (p *Publisher) start(ctx context.Context, m pgrelay.Message, mayBlock bool) rounds.Await {
	rec, err := p.wireRecord(m)
	if err == nil {
		err = p.check(rec)
	}
	if err != nil {
		return rounds.Err(err)
	}
	took, err := rounds.Take(ctx, p.slots, mayBlock)
	if err != nil {
		return rounds.Err(fmt.Errorf("not sent: %w", err))
	}
	if !took {
		return nil // no room: the next round
	}
	done := make(chan error, 1)
	p.cl.Produce(ctx, rec, func(_ *kgo.Record, err error) { done <- err })
	return func() broker.Result {
		defer func() { <-p.slots }()
		select {
		case err := <-done:
			if err != nil {
				return broker.Result{Err: p.classify(rec, err)}
			}
			return broker.Result{}
		case <-ctx.Done():
			// A record already sent is not withdrawn (idempotence): it
			// may still be stored, ahead of anything sent later, and the
			// relay's retry of it is a duplicate the inbox absorbs.
			return broker.Result{Err: fmt.Errorf("kafka: waiting for the acknowledgement: %w", ctx.Err())}
		}
	}
}

// check refuses, without sending it, a record no broker will accept.
func (p *Publisher) check(r *kgo.Record) error {
	if !legalTopic.MatchString(r.Topic) || len(r.Topic) > maxTopicLen {
		return broker.Terminalf("%q is not a legal Kafka topic name (letters, digits, '.', '_', '-', at most %d)", r.Topic, maxTopicLen)
	}
	if n := recordSize(r); n > p.cfg.MaxMessageBytes {
		return broker.Terminalf("record of %d bytes (key, payload and headers) is larger than kafka.Config.MaxMessageBytes %d", n, p.cfg.MaxMessageBytes)
	}
	return nil
}

// tooLargeSlack is how close to MaxMessageBytes a record must be for a
// "message too large" answer to be its own fault rather than its batch's.
const tooLargeSlack = 512

// classify turns a produce error into a permanent one when no retry can fix
// it; everything else (timeouts, broker restarts, leader moves) stays
// transient.
func (p *Publisher) classify(r *kgo.Record, err error) error {
	switch {
	case errors.Is(err, kerr.UnknownTopicOrPartition), errors.Is(err, kerr.UnknownTopicID):
		// Only after UnknownTopicRetries metadata refreshes in a row.
		return broker.Terminalf("no Kafka topic %q (topics are not created automatically): %w", r.Topic, err)
	case errors.Is(err, kerr.InvalidTopicException):
		return broker.Terminalf("invalid Kafka topic %q: %w", r.Topic, err)
	case errors.Is(err, kerr.InvalidRecord):
		return broker.Terminalf("record refused by the broker: %w", err)
	case errors.Is(err, kerr.MessageTooLarge), errors.Is(err, kerr.RecordListTooLarge):
		if recordSize(r)+tooLargeSlack > p.cfg.MaxMessageBytes {
			// The broker's answer names no value: give the record's size
			// and the limit this side knows.
			return broker.Terminalf("record too large for topic %q: record of %d bytes (key, payload and headers) is above the broker's limit "+
				"(the topic's max.message.bytes); kafka.Config.MaxMessageBytes is %d: %w", r.Topic, recordSize(r), p.cfg.MaxMessageBytes, err)
		}
		// A smaller record fails with the batch it was in: the topic's
		// max.message.bytes is below Config.MaxMessageBytes.
		return fmt.Errorf("batch too large for topic %q (is kafka.Config.MaxMessageBytes above the topic's max.message.bytes?): %w", r.Topic, err)
	}
	return fmt.Errorf("kafka: produce to %q: %w", r.Topic, err)
}

// Close closes the client. Callers wait for their acknowledgements in Publish.
func (p *Publisher) Close() error {
	p.cl.Close()
	return nil
}

// kgoLogger passes franz-go's warnings and errors to the logger.
type kgoLogger struct{ l *slog.Logger }

func (z kgoLogger) Level() kgo.LogLevel { return kgo.LogLevelWarn }

func (z kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	fields := make([]any, 0, len(keyvals)/2)
	for i := 0; i+1 < len(keyvals); i += 2 {
		k, _ := keyvals[i].(string)
		fields = append(fields, slog.Any(k, keyvals[i+1]))
	}
	switch level {
	case kgo.LogLevelError:
		z.l.Error(msg, fields...)
	case kgo.LogLevelWarn:
		z.l.Warn(msg, fields...)
	case kgo.LogLevelInfo:
		z.l.Info(msg, fields...)
	default:
		z.l.Debug(msg, fields...)
	}
}
