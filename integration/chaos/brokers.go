package chaos

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os/exec"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	pgnats "github.com/pgrelay/pgrelay/broker/nats"
	"github.com/pgrelay/pgrelay/broker/rabbitmq"
	"github.com/pgrelay/pgrelay/internal/event"
)

// Brokers a run can drive (Config.Broker).
const (
	BrokerNATS     = "nats"
	BrokerRabbitMQ = "rabbitmq"
)

// brokerEnv is the broker of a run: how the services reach it, how faults
// strike it, how events are injected straight into it and how the checker
// reads back everything it stored, in order.
type brokerEnv interface {
	// label names the broker in the fault log ("NATS").
	label() string
	// upstream is the host:port the services' proxy forwards to.
	upstream() string
	// serviceEnv returns the relay's and the consumer's broker settings,
	// reaching the broker at proxied (host:port).
	serviceEnv(proxied string) (relay, consumer []string)
	// restart stops the broker, keeps it down for down, and starts it again.
	restart(ctx context.Context, down time.Duration) error
	// outstanding returns the messages not yet delivered to a consumer and
	// those delivered and not acknowledged (-1 where the broker cannot tell).
	outstanding(ctx context.Context) (pending, unacked int64, err error)
	// publishRaw publishes one event straight to the broker with the relay's
	// headers, bypassing the outbox.
	publishRaw(ctx context.Context, id, typ, key string, payload []byte) error
	// injectDuplicates republishes random stored messages under new broker
	// ids (so that no broker dedup drops them): the inbox must absorb them.
	// It returns a description and how many copies it sent.
	injectDuplicates(ctx context.Context, rng *mrand.Rand, seed uint64) (string, int, error)
	// readLog returns every message the broker stored, in order.
	readLog(ctx context.Context) ([]streamMsg, error)
	close()
}

// natsEnv is a private NATS JetStream server (restartable in process) with
// the stream CHAOS over the subjects "chaos.>".
type natsEnv struct {
	srv *natsServer
	nc  *nats.Conn
	js  jetstream.JetStream
}

const (
	streamName    = "CHAOS"
	subjectPrefix = "chaos"
	durable       = "chaos"
)

func startNATSEnv(ctx context.Context, work string) (*natsEnv, error) {
	srv, err := startNATS(work)
	if err != nil {
		return nil, err
	}
	e := &natsEnv{srv: srv}
	if e.nc, err = nats.Connect(srv.url(), nats.MaxReconnects(-1), nats.ReconnectWait(200*time.Millisecond)); err != nil {
		srv.shutdown()
		return nil, err
	}
	if e.js, err = jetstream.New(e.nc); err == nil {
		_, err = e.js.CreateStream(ctx, pgnats.StreamSpec{Name: streamName, SubjectPrefix: subjectPrefix}.Config())
	}
	if err != nil {
		e.close()
		return nil, fmt.Errorf("chaos: create stream: %w", err)
	}
	return e, nil
}

func (e *natsEnv) label() string    { return "NATS" }
func (e *natsEnv) upstream() string { return e.srv.listen }
func (e *natsEnv) close()           { e.nc.Close(); e.srv.shutdown() }

func (e *natsEnv) serviceEnv(proxied string) (relay, consumer []string) {
	return []string{"NATS_URL=nats://" + proxied, "RELAY_STREAM=" + streamName, "RELAY_SUBJECT_PREFIX=" + subjectPrefix,
			"RELAY_ACK_TIMEOUT=3s"},
		[]string{"NATS_URL=nats://" + proxied, "CONSUMER_STREAM=" + streamName, "CONSUMER_SUBJECT_PREFIX=" + subjectPrefix,
			"CONSUMER_DURABLE=" + durable, "CONSUMER_ACK_WAIT=3s"}
}

func (e *natsEnv) restart(_ context.Context, down time.Duration) error { return e.srv.restart(down) }

func (e *natsEnv) outstanding(ctx context.Context) (int64, int64, error) {
	c, err := e.js.Consumer(ctx, streamName, durable)
	if err != nil {
		return 0, 0, err
	}
	ci, err := c.Info(ctx)
	if err != nil {
		return 0, 0, err
	}
	return int64(ci.NumPending), int64(ci.NumAckPending), nil
}

func (e *natsEnv) publishRaw(ctx context.Context, id, typ, key string, payload []byte) error {
	m := nats.NewMsg(subjectPrefix + ".orders")
	m.Data = payload
	m.Header.Set(pgnats.MsgIDHeader, id)
	m.Header.Set(event.HeaderEventID, id)
	m.Header.Set(event.HeaderEventType, typ)
	m.Header.Set(event.HeaderTopic, "orders")
	m.Header.Set(event.HeaderKey, key)
	m.Header.Set(event.HeaderOccurredAt, time.Now().UTC().Format(time.RFC3339Nano))
	_, err := e.js.PublishMsg(ctx, m)
	return err
}

// injectDuplicates republishes each picked message once under its own broker
// id (JetStream drops it within its window) and once under a new one (it
// reaches the consumers; the inbox absorbs it).
func (e *natsEnv) injectDuplicates(ctx context.Context, rng *mrand.Rand, seed uint64) (string, int, error) {
	st, err := e.js.Stream(ctx, streamName)
	if err != nil {
		return "", 0, err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return "", 0, err
	}
	if info.State.LastSeq == 0 {
		return "skipped: the stream is still empty", 0, nil
	}
	n, sent, dropped := 10+rng.IntN(20), 0, 0
	for range n {
		seq := info.State.FirstSeq + rng.Uint64N(info.State.LastSeq-info.State.FirstSeq+1)
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			continue
		}
		for copyN, msgID := range []string{m.Header.Get(pgnats.MsgIDHeader), fmt.Sprintf("chaos-dup-%d-%d-%d", seed, seq, rng.Int64())} {
			out := nats.NewMsg(m.Subject)
			out.Data = m.Data
			for k, v := range m.Header {
				out.Header[k] = v
			}
			out.Header.Set(pgnats.MsgIDHeader, msgID)
			ack, err := e.js.PublishMsg(ctx, out)
			if err != nil {
				return "", 0, err
			}
			if copyN == 0 && ack.Duplicate {
				dropped++
			}
			if copyN == 1 {
				sent++
			}
		}
	}
	return fmt.Sprintf("%d duplicates published under new broker ids (and %d under their own, %d of those dropped by JetStream)", sent, sent, dropped), sent, nil
}

func (e *natsEnv) readLog(ctx context.Context) ([]streamMsg, error) {
	return readStream(ctx, e.js, streamName)
}

// rabbitEnv is a RabbitMQ server shared with others (AMQP_URL, else the
// local one), isolated by names of the run's own: a durable topic exchange,
// the consumers' queue, and an audit queue bound to the same exchange that
// nobody consumes, so that the checker reads back every message stored, in
// the order the exchange routed them. restart stops and starts the RabbitMQ
// application with rabbitmqctl, when the run may (Config.BrokerRestart).
type rabbitEnv struct {
	url, addr              string
	exchange, queue, audit string
	conn                   *amqp.Connection
	ch                     *amqp.Channel
}

func startRabbitEnv(ctx context.Context, amqpURL string) (*rabbitEnv, error) {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	base := "chaos-" + hex.EncodeToString(b)
	e := &rabbitEnv{url: amqpURL, exchange: base, queue: base, audit: base + "-audit"}
	host, err := amqpHost(amqpURL)
	if err != nil {
		return nil, err
	}
	e.addr = host
	// The consumers' queue, declared as the services declare it (quorum
	// where supported), and the audit queue (classic, never consumed).
	// Retried for a while: a test elsewhere may be restarting the shared
	// server.
	var pub *rabbitmq.Publisher
	for end := time.Now().Add(time.Minute); ; {
		if pub, err = rabbitmq.NewPublisher(ctx, rabbitmq.Config{URL: amqpURL, Exchange: e.exchange, Queue: e.queue}); err == nil {
			break
		}
		if time.Now().After(end) || sleepCtx(ctx, 500*time.Millisecond) != nil {
			return nil, fmt.Errorf("chaos: RabbitMQ at %s: %w", rabbitmq.RedactURL(amqpURL), err)
		}
	}
	_ = pub.Close()
	if err := e.connect(); err != nil {
		return nil, err
	}
	if _, err := e.ch.QueueDeclare(e.audit, true, false, false, false, nil); err != nil {
		e.close()
		return nil, fmt.Errorf("chaos: declare the audit queue: %w", err)
	}
	if err := e.ch.QueueBind(e.audit, "#", e.exchange, false, nil); err != nil {
		e.close()
		return nil, fmt.Errorf("chaos: bind the audit queue: %w", err)
	}
	return e, nil
}

func amqpHost(u string) (string, error) {
	cfg := rabbitmq.Config{URL: u}.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return "", err
	}
	uri, err := amqp.ParseURI(u)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s:%d", uri.Host, uri.Port), nil
}

// connect (re)opens the run's own connection, used for injections and reads.
func (e *rabbitEnv) connect() error {
	if e.conn != nil && !e.conn.IsClosed() && e.ch != nil && !e.ch.IsClosed() {
		return nil
	}
	if e.conn != nil {
		_ = e.conn.Close()
	}
	var err error
	if e.conn, err = amqp.DialConfig(e.url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)}); err != nil {
		return fmt.Errorf("chaos: RabbitMQ: %w", err)
	}
	if e.ch, err = e.conn.Channel(); err == nil {
		err = e.ch.Confirm(false)
	}
	if err != nil {
		_ = e.conn.Close()
		return fmt.Errorf("chaos: RabbitMQ channel: %w", err)
	}
	return nil
}

func (e *rabbitEnv) label() string    { return "RabbitMQ" }
func (e *rabbitEnv) upstream() string { return e.addr }

func (e *rabbitEnv) close() {
	if e.connect() == nil {
		_, _ = e.ch.QueueDelete(e.queue, false, false, false)
		_, _ = e.ch.QueueDelete(e.audit, false, false, false)
		_ = e.ch.ExchangeDelete(e.exchange, false, false)
	}
	if e.conn != nil {
		_ = e.conn.Close()
	}
}

func (e *rabbitEnv) serviceEnv(proxied string) (relay, consumer []string) {
	uri, _ := amqp.ParseURI(e.url)
	host, port, _ := strings.Cut(proxied, ":")
	uri.Host = host
	_, _ = fmt.Sscanf(port, "%d", &uri.Port)
	common := []string{"PGRELAY_BROKER=rabbitmq", "AMQP_URL=" + uri.String(), "AMQP_EXCHANGE=" + e.exchange, "AMQP_QUEUE=" + e.queue}
	return append(common, "AMQP_CONFIRM_TIMEOUT=3s"), append(common, "AMQP_PREFETCH=200")
}

func (e *rabbitEnv) restart(ctx context.Context, down time.Duration) error {
	if err := rabbitmqctl(ctx, "stop_app"); err != nil {
		return err
	}
	if err := sleepCtx(ctx, down); err != nil {
		return err
	}
	return rabbitmqctl(ctx, "start_app")
}

func rabbitmqctl(ctx context.Context, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "rabbitmqctl", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("chaos: rabbitmqctl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// outstanding counts the ready messages of the consumers' queue; AMQP does
// not tell the unacknowledged ones (-1).
func (e *rabbitEnv) outstanding(_ context.Context) (int64, int64, error) {
	if err := e.connect(); err != nil {
		return 0, 0, err
	}
	q, err := e.ch.QueueDeclarePassive(e.queue, true, false, false, false, nil)
	if err != nil {
		return 0, 0, err
	}
	return int64(q.Messages), -1, nil
}

// publish publishes one message on the run's own connection and waits for
// its confirm, connecting again and retrying for a while: the shared server
// may be restarting (this run's fault, or another test's).
func (e *rabbitEnv) publish(ctx context.Context, routingKey string, p amqp.Publishing) error {
	try := func() error {
		if err := e.connect(); err != nil {
			return err
		}
		dc, err := e.ch.PublishWithDeferredConfirmWithContext(ctx, e.exchange, routingKey, true, false, p)
		if err != nil {
			return err
		}
		ok, err := dc.WaitContext(ctx)
		if err == nil && !ok {
			err = errors.New("chaos: RabbitMQ refused an injected message")
		}
		return err
	}
	var err error
	for end := time.Now().Add(30 * time.Second); ; {
		if err = try(); err == nil || time.Now().After(end) || sleepCtx(ctx, 500*time.Millisecond) != nil {
			return err
		}
	}
}

func (e *rabbitEnv) publishRaw(ctx context.Context, id, typ, key string, payload []byte) error {
	return e.publish(ctx, "orders", amqp.Publishing{
		Headers: amqp.Table{event.HeaderEventID: id, event.HeaderEventType: typ, event.HeaderTopic: "orders",
			event.HeaderKey: key, event.HeaderOccurredAt: time.Now().UTC().Format(time.RFC3339Nano)},
		MessageId: id, DeliveryMode: amqp.Persistent, Body: payload,
	})
}

// injectDuplicates republishes random messages read from the audit queue
// (without consuming them) under new message-ids; RabbitMQ has no dedup, so
// every copy reaches the consumers.
func (e *rabbitEnv) injectDuplicates(ctx context.Context, rng *mrand.Rand, seed uint64) (string, int, error) {
	log, err := e.peekAudit(ctx, 500)
	if err != nil {
		return "", 0, err
	}
	if len(log) == 0 {
		return "skipped: nothing published yet", 0, nil
	}
	n, sent := 10+rng.IntN(20), 0
	for range n {
		d := log[rng.IntN(len(log))]
		h := amqp.Table{}
		for k, v := range d.Headers {
			h[k] = v
		}
		err := e.publish(ctx, d.RoutingKey, amqp.Publishing{Headers: h, ContentType: d.ContentType, Type: d.Type,
			MessageId: fmt.Sprintf("chaos-dup-%d-%d", seed, rng.Int64()), DeliveryMode: amqp.Persistent,
			Timestamp: d.Timestamp, AppId: d.AppId, Body: d.Body})
		if err != nil {
			return "", 0, err
		}
		sent++
	}
	return fmt.Sprintf("%d duplicates published under new message-ids (RabbitMQ has no dedup: the inbox absorbs them)", sent), sent, nil
}

// peekAudit reads up to max messages from the head of the audit queue and
// requeues them (unacknowledged, then the channel closes), in order.
func (e *rabbitEnv) peekAudit(ctx context.Context, max int) ([]amqp.Delivery, error) {
	if err := e.connect(); err != nil {
		return nil, err
	}
	ch, err := e.conn.Channel()
	if err != nil {
		return nil, err
	}
	defer func() { _ = ch.Close() }() // requeues what was read
	var out []amqp.Delivery
	for len(out) < max && ctx.Err() == nil {
		d, ok, err := ch.Get(e.audit, false)
		if err != nil {
			return nil, err
		}
		if !ok {
			break
		}
		out = append(out, d)
	}
	return out, nil
}

// readLog consumes the whole audit queue in order. The position in the
// queue stands in for the stream sequence.
func (e *rabbitEnv) readLog(ctx context.Context) ([]streamMsg, error) {
	if err := e.connect(); err != nil {
		return nil, err
	}
	q, err := e.ch.QueueDeclarePassive(e.audit, true, false, false, false, nil)
	if err != nil {
		return nil, fmt.Errorf("chaos: audit queue: %w", err)
	}
	ch, err := e.conn.Channel()
	if err != nil {
		return nil, err
	}
	defer func() { _ = ch.Close() }()
	if err := ch.Qos(1000, 0, false); err != nil {
		return nil, err
	}
	ds, err := ch.Consume(e.audit, "", true, true, false, false, nil)
	if err != nil {
		return nil, fmt.Errorf("chaos: read the audit queue: %w", err)
	}
	out := make([]streamMsg, 0, q.Messages)
	for len(out) < q.Messages {
		select {
		case d, ok := <-ds:
			if !ok {
				return nil, fmt.Errorf("chaos: read the audit queue: closed after %d of %d messages", len(out), q.Messages)
			}
			str := func(k string) string { s, _ := d.Headers[k].(string); return s }
			out = append(out, streamMsg{seq: uint64(len(out) + 1), msgID: d.MessageId, eventID: str(event.HeaderEventID), key: str(event.HeaderKey)})
		case <-time.After(10 * time.Second):
			return nil, fmt.Errorf("chaos: read the audit queue: %d of %d messages, then nothing", len(out), q.Messages)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return out, nil
}
