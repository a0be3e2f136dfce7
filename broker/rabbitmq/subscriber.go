package rabbitmq

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/logbridge"
	"github.com/pgrelay/pgrelay/internal/wait"
)

// Subscriber consumes Config.Queue with manual acknowledgements: a delivery
// is acknowledged only when the caller calls its Ack (after the inbox
// transaction committed). The server sends at most Config.Prefetch
// unacknowledged deliveries ahead (basic.qos). When the channel or the
// connection is lost, the server requeues everything unacknowledged and
// delivers it again; the subscriber reconnects with backoff on its next
// Fetch.
type Subscriber struct {
	cfg  Config
	log  *slog.Logger
	opts broker.DecodeOptions

	mu        sync.Mutex // guards the fields below
	sess      *subSession
	closed    bool
	retryAt   time.Time
	reconnect *wait.Backoff
}

var _ broker.Subscriber = (*Subscriber)(nil)

// subSession is one connection and its consuming channel.
type subSession struct {
	conn       *amqp.Connection
	ch         *amqp.Channel
	deliveries <-chan amqp.Delivery
}

// NewSubscriber connects to RabbitMQ, declares the topology (or with
// Config.SkipDeclare checks that the queue exists) and starts consuming
// Config.Queue. A payload over Config.MaxPayloadBytes is delivered with a
// dead reason. The first
// connection is not retried, so a wrong URL is reported at once.
func NewSubscriber(ctx context.Context, cfg Config) (*Subscriber, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Subscriber{cfg: cfg, log: logbridge.Or(cfg.Logger).With(slog.String("logger", "rabbitmq")), reconnect: wait.New(wait.Policy{Min: cfg.ReconnectWait, Max: cfg.ReconnectMaxWait}),
		opts: broker.DecodeOptions{MaxPayloadBytes: cfg.MaxPayloadBytes}}
	sess, err := s.connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: %w", err)
	}
	s.sess = sess
	return s, nil
}

func (s *Subscriber) connect(ctx context.Context) (*subSession, error) {
	conn, ch, err := openChannel(ctx, s.cfg, "pgrelay-consumer", true, s.log)
	if err != nil {
		return nil, err
	}
	err = ch.Qos(s.cfg.Prefetch, 0, false)
	var deliveries <-chan amqp.Delivery
	if err == nil {
		// Manual acknowledgements (autoAck false): nothing counts as
		// consumed before the caller's Ack.
		// Not ConsumeWithContext: its context would cancel the consumer.
		deliveries, err = ch.Consume(s.cfg.Queue, "", false, false, false, false, nil)
	}
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("consume queue %q: %w", s.cfg.Queue, err)
	}
	return &subSession{conn: conn, ch: ch, deliveries: deliveries}, nil
}

// session returns the current session, connecting again when there is none
// and the backoff pause, waited for at most maxWait, has passed.
func (s *Subscriber) session(ctx context.Context, maxWait time.Duration) (*subSession, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errors.New("rabbitmq: subscriber closed")
	}
	if s.sess != nil {
		return s.sess, nil
	}
	if wait := time.Until(s.retryAt); wait > 0 {
		t := time.NewTimer(min(wait, maxWait))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
		if wait > maxWait {
			return nil, fmt.Errorf("rabbitmq: not connected; next attempt in %s", time.Until(s.retryAt).Round(time.Millisecond))
		}
	}
	sess, err := s.connect(ctx)
	if err != nil {
		s.retryAt = time.Now().Add(s.reconnect.Next())
		return nil, fmt.Errorf("rabbitmq: reconnect: %w", err)
	}
	s.reconnect.Reset()
	s.log.Info("consuming from RabbitMQ again", slog.String("queue", s.cfg.Queue))
	s.sess = sess
	return sess, nil
}

// lost drops sess after its channel closed; the next Fetch connects again.
func (s *Subscriber) lost(sess *subSession) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("rabbitmq: subscriber closed")
	}
	if s.sess == sess {
		s.sess = nil
		_ = sess.conn.Close()
		// Connect again at once the first time: a closed channel is often
		// a restarted server that is back already.
		s.retryAt = time.Time{}
	}
	s.log.Warn("RabbitMQ channel closed; unacknowledged deliveries will come again", slog.String("queue", s.cfg.Queue))
	return errors.New("rabbitmq: channel closed; reconnecting (unacknowledged deliveries come again)")
}

// Fetch implements broker.Subscriber.
func (s *Subscriber) Fetch(ctx context.Context, max int, maxWait time.Duration) ([]broker.Delivery, error) {
	if max < 1 {
		return nil, nil
	}
	sess, err := s.session(ctx, maxWait)
	if err != nil {
		return nil, err
	}
	t := time.NewTimer(maxWait)
	defer t.Stop()
	var out []broker.Delivery
	select {
	case d, ok := <-sess.deliveries:
		if !ok {
			return nil, s.lost(sess)
		}
		out = s.appendDelivery(out, sess, d)
	case <-t.C:
		return nil, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	for len(out) < max {
		select {
		case d, ok := <-sess.deliveries:
			if !ok {
				// The channel closed: what was fetched cannot be
				// acknowledged any more, and comes again.
				return nil, s.lost(sess)
			}
			out = s.appendDelivery(out, sess, d)
		default:
			return out, nil
		}
	}
	return out, nil
}

// appendDelivery decodes d and appends it to out.
func (s *Subscriber) appendDelivery(out []broker.Delivery, sess *subSession, d amqp.Delivery) []broker.Delivery {
	dv, err := broker.Decode(Received(d, s.cfg.Queue), s.opts)
	ref := fmt.Sprintf("queue %s tag %d", s.cfg.Queue, d.DeliveryTag)
	if d.Redelivered {
		ref += " (redelivered)"
	}
	if err != nil {
		// Received always gives a stand-in id, so this does not happen;
		// the delivery stays unacknowledged until the channel closes.
		s.log.Error("delivery left unacknowledged", slog.String("ref", ref), slog.Any("error", err))
		return out
	}
	dv.Ref = ref
	var acked atomic.Bool
	dv.Ack = func(context.Context) error {
		if sess.ch.IsClosed() {
			return fmt.Errorf("rabbitmq: ack %s: the channel closed; the server delivers it again", ref)
		}
		// A second ack of one tag would be a channel error (and requeue
		// everything unacknowledged): ack once.
		if !acked.CompareAndSwap(false, true) {
			return nil
		}
		if err := d.Ack(false); err != nil {
			return fmt.Errorf("rabbitmq: ack %s: %w", ref, err)
		}
		return nil
	}
	// RabbitMQ redelivers only when the channel closes: nothing to extend.
	dv.InProgress = func(context.Context) error { return nil }
	dv.FirstDelivery = !d.Redelivered
	return append(out, dv)
}

// Close stops consuming and closes the connection; the server requeues what
// was not acknowledged.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.sess != nil {
		_ = s.sess.conn.Close()
		s.sess = nil
	}
	return nil
}

// Received maps an AMQP delivery from queue onto pgrelay's logical form
// for broker.Decode: the headers table as strings (a header pgrelay wrote
// takes precedence; the content-type and type properties stand in for
// missing Pgrelay-Content-Type and Pgrelay-Event-Type headers), the
// message-id as the broker's id, the routing key as the topic, the timestamp
// property as the time, and StandInID as the fallback id.
func Received(d amqp.Delivery, queue string) broker.Received {
	h := make(map[string][]string, len(d.Headers)+2)
	for k, v := range d.Headers {
		if strings.HasPrefix(k, amqp10Prefix) {
			continue // AMQP 1.0 sections, below
		}
		if s, ok := headerString(v); ok {
			h[k] = []string{s}
		}
	}
	// An AMQP 1.0 client's application-properties (RabbitMQ 3.x's AMQP 1.0
	// plugin keeps them encoded in one header): headers like the others,
	// a 0-9-1 header of the same name first. Undecodable ones are left out.
	if s, ok := headerString(d.Headers[AppPropertiesHeader]); ok {
		if props, err := decodeAppProperties([]byte(s)); err == nil {
			for k, v := range props {
				if _, dup := h[k]; !dup {
					h[k] = []string{v}
				}
			}
		}
	}
	if _, ok := h[event.HeaderContentType]; !ok && d.ContentType != "" {
		h[event.HeaderContentType] = []string{d.ContentType}
	}
	if _, ok := h[event.HeaderEventType]; !ok && d.Type != "" {
		h[event.HeaderEventType] = []string{d.Type}
	}
	return broker.Received{
		Headers:      h,
		Payload:      d.Body,
		BrokerID:     d.MessageId,
		BrokerIDName: "message-id",
		Topic:        d.RoutingKey,
		FallbackID:   StandInID(d, queue),
		Timestamp:    d.Timestamp,
	}
}

// headerString renders an AMQP header value as text: strings and byte
// arrays as they are, other scalars formatted; tables and arrays are left
// out (pgrelay never writes them).
func headerString(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, true
	case []byte:
		return string(x), true
	case nil, amqp.Table, []any:
		return "", false
	case time.Time:
		return x.UTC().Format(time.RFC3339), true
	default:
		return fmt.Sprint(x), true
	}
}

// StandInID is the id given to a delivery without a usable event id:
// "amqp:<queue>:<hash>", the hash (SHA-256, 128 bits shown) of what RabbitMQ
// keeps unchanged across redeliveries: the exchange and routing key it was
// published with, its properties, its headers except the x-* ones the server
// adds (x-delivery-count, x-death; the AMQP 1.0 plugin's x-amqp-1.0-* ones,
// an AMQP 1.0 sender's sections, count), and its body. RabbitMQ has no stable
// message position (no stream sequence; delivery tags are per channel), so
// the id is derived from content: every redelivery of the message gets the
// same id and the inbox deduplicates it, but two byte-identical messages
// without an event id also share it and are stored as one (dead) row, the
// second counted as a duplicate.
func StandInID(d amqp.Delivery, queue string) string {
	h := sha256.New()
	field := func(s string) {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	field(d.Exchange)
	field(d.RoutingKey)
	for _, p := range []string{d.ContentType, d.ContentEncoding, d.CorrelationId, d.ReplyTo, d.Expiration,
		d.MessageId, d.Type, d.UserId, d.AppId} {
		field(p)
	}
	field(fmt.Sprint(d.DeliveryMode, d.Priority, d.Timestamp.Unix()))
	names := make([]string, 0, len(d.Headers))
	for k := range d.Headers {
		// The AMQP 1.0 plugin's x-amqp-1.0-* headers are the message's own
		// sections (an AMQP 1.0 sender's application-properties): kept.
		if !strings.HasPrefix(k, "x-") || strings.HasPrefix(k, amqp10Prefix) {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	for _, k := range names {
		field(k)
		field(fmt.Sprintf("%T:%v", d.Headers[k], d.Headers[k]))
	}
	field(string(d.Body))
	return "amqp:" + queue + ":" + hex.EncodeToString(h.Sum(nil)[:16])
}
