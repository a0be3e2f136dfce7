package kafka

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/pgrelay/pgrelay/internal/broker"
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
	log *zap.Logger
}

var _ broker.Publisher = (*Publisher)(nil)

// NewPublisher validates cfg (after WithDefaults), connects and checks that a
// broker answers, so that a wrong --kafka-brokers fails at start-up.
func NewPublisher(ctx context.Context, cfg Config) (*Publisher, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger.Named("kafka")
	opts := append(commonOpts(cfg, log),
		kgo.RequiredAcks(kgo.AllISRAcks()), // idempotence needs it, and a record acknowledged by one replica only can be lost
		kgo.MaxBufferedRecords(cfg.MaxInFlight),
		kgo.ProducerBatchMaxBytes(int32(cfg.MaxMessageBytes)),
		kgo.UnknownTopicRetries(cfg.UnknownTopicRetries),
		kgo.RecordDeliveryTimeout(cfg.DeliveryTimeout),
		kgo.ProducerLinger(0),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka: producer: %w", err)
	}
	if err := ping(ctx, cl, cfg); err != nil {
		cl.Close()
		return nil, err
	}
	return &Publisher{cfg: cfg, cl: cl, log: log}, nil
}

// commonOpts are the client options the publisher and subscriber share.
func commonOpts(cfg Config, log *zap.Logger) []kgo.Opt {
	opts := []kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ClientID(cfg.ClientID),
		kgo.DialTimeout(cfg.DialTimeout),
		kgo.MetadataMaxAge(cfg.MetadataMaxAge),
		// Refreshes may come as often as every second: an unknown topic is
		// looked up again UnknownTopicRetries times before it is refused.
		kgo.MetadataMinAge(min(time.Second, cfg.MetadataMaxAge)),
		kgo.WithLogger(zapLogger{log}),
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
		return fmt.Errorf("kafka: no broker of --kafka-brokers %s answers: %w", strings.Join(cfg.Brokers, ","), err)
	}
	return nil
}

// Client returns the underlying franz-go client.
func (p *Publisher) Client() *kgo.Client { return p.cl }

// Publish implements broker.Publisher. Every message is handed to the
// producer at once (up to MaxInFlight records in flight across calls), so
// keys are published concurrently and one key's messages are pipelined on its
// partition; the idempotent producer keeps them in order through its own
// retries. A record that fails fails every record buffered behind it on its
// partition, so none of a key's later messages is stored after an earlier one
// failed; those not yet handed over are not sent.
func (p *Publisher) Publish(ctx context.Context, msgs []broker.Message) []broker.Result {
	results := make([]broker.Result, len(msgs))
	byKey := make(map[string][]int)
	var keys []string
	for i, m := range msgs {
		if _, ok := byKey[m.Key]; !ok {
			keys = append(keys, m.Key)
		}
		byKey[m.Key] = append(byKey[m.Key], i)
	}

	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		failed = make(map[string]error) // keys with a transient failure
	)
	keyFailed := func(k string) error {
		mu.Lock()
		defer mu.Unlock()
		return failed[k]
	}
	for _, k := range keys {
		for _, i := range byKey[k] {
			if err := keyFailed(k); err != nil {
				results[i].Err = notSent(k, err)
				continue
			}
			rec := toRecord(p.cfg.TopicPrefix, msgs[i])
			if err := p.check(rec); err != nil {
				results[i].Err = err // permanent: dead-lettered, the key goes on
				continue
			}
			wg.Add(1)
			p.cl.Produce(ctx, rec, func(r *kgo.Record, err error) {
				defer wg.Done()
				if err == nil {
					return
				}
				err = p.classify(r, err)
				results[i].Err = err
				if !broker.IsPermanent(err) {
					mu.Lock()
					if failed[k] == nil {
						failed[k] = err
					}
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()

	// A key's messages after its first transient failure are reported failed
	// even when stored, so that the relay publishes them again after the
	// failed one. The producer fails a partition's buffered records together,
	// so this only happens when a record was handed over in the instant
	// between its predecessor's failure and that failure being seen here.
	for _, k := range keys {
		var first error
		for _, i := range byKey[k] {
			switch {
			case first != nil && results[i].Err == nil:
				p.log.Warn("a record was stored after an earlier record of its key failed; both are published again",
					zap.String("key", k), zap.String("event_id", msgs[i].EventID), zap.Error(first))
				results[i].Err = notSent(k, first)
			case first == nil && results[i].Err != nil && !broker.IsPermanent(results[i].Err):
				first = results[i].Err
			}
		}
	}
	return results
}

func notSent(key string, err error) error {
	return fmt.Errorf("not sent: an earlier event of key %q failed: %w", key, err)
}

// check refuses, without sending it, a record no broker will accept.
func (p *Publisher) check(r *kgo.Record) error {
	if !legalTopic.MatchString(r.Topic) || len(r.Topic) > maxTopicLen {
		return broker.Permanentf("%q is not a legal Kafka topic name (letters, digits, '.', '_', '-', at most %d)", r.Topic, maxTopicLen)
	}
	if n := recordSize(r); n > p.cfg.MaxMessageBytes {
		return broker.Permanentf("record of %d bytes (key, payload and headers) is larger than --kafka-max-message-bytes %d", n, p.cfg.MaxMessageBytes)
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
		return broker.Permanentf("no Kafka topic %q (topics are not created automatically): %w", r.Topic, err)
	case errors.Is(err, kerr.InvalidTopicException):
		return broker.Permanentf("invalid Kafka topic %q: %w", r.Topic, err)
	case errors.Is(err, kerr.InvalidRecord):
		return broker.Permanentf("record refused by the broker: %w", err)
	case errors.Is(err, kerr.MessageTooLarge), errors.Is(err, kerr.RecordListTooLarge):
		if recordSize(r)+tooLargeSlack > p.cfg.MaxMessageBytes {
			return broker.Permanentf("record too large for topic %q: %w", r.Topic, err)
		}
		// A smaller record fails with the batch it was in: the topic's
		// max.message.bytes is below --kafka-max-message-bytes.
		return fmt.Errorf("batch too large for topic %q (is --kafka-max-message-bytes above the topic's max.message.bytes?): %w", r.Topic, err)
	}
	return fmt.Errorf("kafka: produce to %q: %w", r.Topic, err)
}

// Close closes the client. Callers wait for their acknowledgements in Publish.
func (p *Publisher) Close() error {
	p.cl.Close()
	return nil
}

// zapLogger passes franz-go's warnings and errors to zap.
type zapLogger struct{ l *zap.Logger }

func (z zapLogger) Level() kgo.LogLevel { return kgo.LogLevelWarn }

func (z zapLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	fields := make([]zap.Field, 0, len(keyvals)/2)
	for i := 0; i+1 < len(keyvals); i += 2 {
		k, _ := keyvals[i].(string)
		fields = append(fields, zap.Any(k, keyvals[i+1]))
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
