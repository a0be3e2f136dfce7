package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"sync"

	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/internal/logbridge"
	"github.com/pgrelay/pgrelay/internal/rounds"
	"github.com/pgrelay/pgrelay/internal/wait"
)

// Publisher publishes to RabbitMQ with publisher confirms: every message is
// persistent (delivery mode 2), carries the event id as its message-id and
// pgrelay's headers in its headers table, and is published mandatory to
// Config.Exchange with the topic as routing key. A message no queue takes
// comes back (basic.return) and is a permanent error, as is one too large.
//
// RabbitMQ has no dedup window: a message published twice (the relay
// re-publishes after a crash between publish and mark) is stored twice, and
// the consumer's inbox absorbs the second copy by its event id. Result's
// Duplicate is therefore never set.
type Publisher struct {
	cfg    Config
	log    *slog.Logger
	window chan struct{} // one token per message awaiting a confirm
	// maxBytes is the body limit in force: Config.MaxMessageBytes, lowered
	// to the server's max_message_size once a refusal names it.
	maxBytes atomic.Int64

	// current mirrors sess for Connected, which must not wait for mu
	// while a reconnection holds it.
	current atomic.Pointer[pubSession]

	mu        sync.Mutex // guards the fields below
	sess      *pubSession
	closed    bool
	retryAt   time.Time     // no new connection attempt before then
	reconnect *wait.Backoff // the pauses after failed attempts
}

var _ broker.Publisher = (*Publisher)(nil)

// NewPublisher connects to RabbitMQ and declares the topology (see the
// package comment): the exchange, the queue and its binding, or with
// Config.SkipDeclare checks that the exchange exists. The first connection
// is not retried, so a wrong URL is reported at once; later ones are made
// again after a failure, with backoff.
func NewPublisher(ctx context.Context, cfg Config) (*Publisher, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p := &Publisher{cfg: cfg, log: logbridge.Or(cfg.Logger).With(slog.String("logger", "rabbitmq")), window: make(chan struct{}, cfg.MaxInFlight), reconnect: wait.New(wait.Policy{Min: cfg.ReconnectWait, Max: cfg.ReconnectMaxWait})}
	p.maxBytes.Store(int64(cfg.MaxMessageBytes))
	s, err := p.connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("rabbitmq: %w", err)
	}
	p.sess = s
	p.current.Store(s)
	return p, nil
}

// pubSession is one connection and its confirm-mode channel.
type pubSession struct {
	conn     *amqp.Connection
	ch       *amqp.Channel
	frameMax int
	// done is closed once the channel is closed; err then holds why.
	done chan struct{}
	err  atomic.Pointer[amqp.Error]
	// stop ends the returns goroutine.
	stop chan struct{}
	take chan takeReq
}

// returnKey identifies a returned message: its routing key and message-id.
type returnKey struct{ routingKey, messageID string }

type takeReq struct {
	key   returnKey
	reply chan *amqp.Return
}

// connect dials, declares the topology and opens a channel in confirm mode.
func (p *Publisher) connect(ctx context.Context) (*pubSession, error) {
	conn, ch, err := openChannel(ctx, p.cfg, "pgrelay-relay", false, p.log)
	if err != nil {
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("put the channel in confirm mode: %w", err)
	}
	s := &pubSession{conn: conn, ch: ch, frameMax: conn.Config.FrameSize, done: make(chan struct{}),
		stop: make(chan struct{}), take: make(chan takeReq)}
	closes := ch.NotifyClose(make(chan *amqp.Error, 1))
	// Unbuffered on purpose: the client hands a basic.return over before it
	// processes the confirm that follows it, so once a confirm arrived, a
	// take request served after it sees the message's return, if any.
	returns := ch.NotifyReturn(make(chan amqp.Return))
	go func() {
		if e, ok := <-closes; ok && e != nil {
			s.err.Store(e)
			p.log.Warn("RabbitMQ channel closed", slog.Any("error", e))
		}
		close(s.done)
	}()
	go s.trackReturns(returns)
	return s, nil
}

// trackReturns records returned messages and answers take requests, in the
// order they arrive. It keeps draining returns after the session stopped,
// until the client closes the channel: the client's reader hands returns
// over synchronously and would otherwise block, connection close included.
func (s *pubSession) trackReturns(returns <-chan amqp.Return) {
	returned := map[returnKey][]amqp.Return{}
	stop := s.stop
	for returns != nil || stop != nil {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil // the channel closed; answer takes until the stop
				continue
			}
			k := returnKey{r.RoutingKey, r.MessageId}
			returned[k] = append(returned[k], r)
		case q := <-s.take:
			var r *amqp.Return
			if rs := returned[q.key]; len(rs) > 0 {
				r = &rs[0]
				if len(rs) == 1 {
					delete(returned, q.key)
				} else {
					returned[q.key] = rs[1:]
				}
			}
			q.reply <- r
		case <-stop:
			stop = nil
		}
	}
}

// returned reports the basic.return received for the message, if any. Call
// it after the message's confirm arrived. known is false when the session
// stopped before it could tell.
func (s *pubSession) returned(routingKey, messageID string) (r *amqp.Return, known bool) {
	q := takeReq{key: returnKey{routingKey, messageID}, reply: make(chan *amqp.Return, 1)}
	select {
	case s.take <- q:
		return <-q.reply, true
	case <-s.stop:
		return nil, false
	}
}

func (s *pubSession) broken() bool {
	select {
	case <-s.done:
		return true
	default:
		return s.conn.IsClosed()
	}
}

func (s *pubSession) close() {
	close(s.stop)
	_ = s.conn.Close()
}

// session returns a usable session, connecting again (after the backoff
// pause, within ctx) when the last one broke.
func (p *Publisher) session(ctx context.Context) (*pubSession, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errors.New("rabbitmq: publisher closed")
	}
	if p.sess != nil && !p.sess.broken() {
		return p.sess, nil
	}
	if p.sess != nil {
		p.sess.close()
		p.sess = nil
	}
	if wait := time.Until(p.retryAt); wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("rabbitmq: waiting to reconnect: %w", ctx.Err())
		}
	}
	s, err := p.connect(ctx)
	if err != nil {
		p.retryAt = time.Now().Add(p.reconnect.Next())
		return nil, fmt.Errorf("rabbitmq: reconnect: %w", err)
	}
	p.reconnect.Reset()
	p.log.Info("connected to RabbitMQ", slog.String("url", RedactURL(p.cfg.URL)))
	p.sess = s
	p.current.Store(s)
	return s, nil
}

// discard drops s after a failure so the next publish connects again.
func (p *Publisher) discard(s *pubSession) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sess == s {
		s.close()
		p.sess = nil
	}
}

// Publish implements broker.Publisher. Messages of different keys are in
// flight at the same time, at most Config.MaxInFlight of them; the messages
// of one key are sent one after another, each once the previous one is
// confirmed, and a key's remaining messages are not sent after a transient
// failure. So a later event of a key is never stored while an earlier one
// failed: the relay retries from the failed one, in order.
//
// It runs on the caller's goroutine, in rounds (internal/rounds): each round
// publishes every key's next message, as many as the window has room for,
// then awaits their confirms.
func (p *Publisher) Publish(ctx context.Context, msgs []pgrelay.Message) []broker.Result {
	return rounds.Publish(msgs, func(i int, mayBlock bool) rounds.Await {
		return p.start(ctx, msgs[i], mayBlock)
	})
}

// start publishes m and returns what awaits its confirm, or nil when the
// window is full and mayBlock is false.
func (p *Publisher) start(ctx context.Context, m pgrelay.Message, mayBlock bool) rounds.Await {
	s, err := p.session(ctx)
	if err != nil {
		return rounds.Err(err)
	}
	pub, rk, err := p.wireEncode(m, s.frameMax, int(p.maxBytes.Load()))
	if err != nil {
		return rounds.Err(err)
	}
	took, err := rounds.Take(ctx, p.window, mayBlock)
	if err != nil {
		return rounds.Err(fmt.Errorf("rabbitmq: waiting for room among the messages in flight: %w", err))
	}
	if !took {
		return nil // no room: the next round
	}
	dc, err := s.ch.PublishWithDeferredConfirmWithContext(ctx, p.cfg.Exchange, rk, true, false, pub)
	if err != nil {
		<-p.window
		p.discard(s)
		return rounds.Err(fmt.Errorf("rabbitmq: publish: %w", err))
	}
	deadline := time.Now().Add(p.cfg.ConfirmTimeout)
	return func() broker.Result {
		err := p.confirmed(ctx, s, dc, deadline, rk, pub.MessageId, len(m.Payload))
		<-p.window
		return broker.Result{Err: err}
	}
}

// confirmed waits until deadline for the confirm of a message published on
// s and tells its outcome.
func (p *Publisher) confirmed(ctx context.Context, s *pubSession, dc *amqp.DeferredConfirmation, deadline time.Time,
	rk, messageID string, size int) error {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-dc.Done():
	case <-ctx.Done():
		return fmt.Errorf("rabbitmq: waiting for the confirm: %w", ctx.Err())
	case <-t.C:
		// A confirm this late means a stuck channel: start afresh. The
		// message may still be stored; a re-publish is absorbed by the inbox.
		p.discard(s)
		return fmt.Errorf("rabbitmq: no confirm within %s (Config.ConfirmTimeout)", p.cfg.ConfirmTimeout)
	}
	ret, known := s.returned(rk, messageID)
	if !dc.Acked() {
		return p.nacked(s, size)
	}
	if !known {
		// Confirmed, but whether it was routed is unknown: publish again
		// (a copy is absorbed by the inbox, a return makes it permanent).
		return errors.New("rabbitmq: confirmed, but the connection closed before its routing was known")
	}
	if ret != nil {
		return broker.Terminalf("unroutable: no queue is bound to exchange %q for routing key %q (basic.return %d %s)",
			p.cfg.Exchange, rk, ret.ReplyCode, ret.ReplyText)
	}
	return nil
}

// maxSizeRefusal matches RabbitMQ's refusal of a message over
// max_message_size ("message size 200 is larger than configured max size 100").
var maxSizeRefusal = regexp.MustCompile(`message size (\d+) is larger than configured max size (\d+)`)

// nacked classifies a negative confirm: the server refused the message
// (basic.nack) or the channel closed before confirming it.
func (p *Publisher) nacked(s *pubSession, size int) error {
	if !s.ch.IsClosed() && !s.conn.IsClosed() {
		return errors.New("rabbitmq: the server refused the message (basic.nack)")
	}
	// The channel is closing: its close reason is on its way.
	select {
	case <-s.done:
	case <-time.After(time.Second):
	}
	e := s.err.Load()
	if e == nil {
		p.discard(s)
		return errors.New("rabbitmq: connection closed before the confirm")
	}
	p.discard(s)
	if sm := maxSizeRefusal.FindStringSubmatch(e.Reason); sm != nil {
		limit, _ := strconv.Atoi(sm[2])
		if limit > 0 && int64(limit) < p.maxBytes.Load() {
			p.maxBytes.Store(int64(limit))
			p.log.Warn("the server's max_message_size is below Config.MaxMessageBytes: using the server's", slog.Int("max_message_size", limit))
		}
		if size > limit {
			return broker.Terminalf("message too large for RabbitMQ: %s", e.Reason)
		}
	}
	return fmt.Errorf("rabbitmq: channel closed before the confirm: %w", e)
}

// Connected reports whether the publisher holds a usable connection (for
// health checks); a broken one is replaced by the next Publish.
func (p *Publisher) Connected() bool {
	s := p.current.Load()
	return s != nil && !s.broken()
}

// Close closes the connection. Callers wait for their confirms in Publish.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	if p.sess != nil {
		p.sess.close()
		p.sess = nil
	}
	return nil
}
