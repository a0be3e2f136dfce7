package demo

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	pgnats "github.com/pgrelay/pgrelay/broker/nats"
	"github.com/pgrelay/pgrelay/broker/rabbitmq"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/natsserver"
)

// Brokers the demo can run on (Config.Broker).
const (
	BrokerNATS     = "nats"
	BrokerRabbitMQ = "rabbitmq"
	BrokerKafka    = "kafka"
)

// demoBroker is the broker of a demo run: the services' settings, raw
// publishing for the injected faults, and the count of messages it stored.
type demoBroker interface {
	// serviceEnv returns the relay's and the consumer's broker settings.
	serviceEnv() (relay, consumer []string)
	// publish publishes one message straight to the broker with the relay's
	// headers; an empty eventID or msgID leaves that id out. It reports
	// whether the broker dropped it as a duplicate of msgID.
	publish(ctx context.Context, eventID, msgID, eventType string, payload []byte, key string) (bool, error)
	// stored counts the messages the broker stored over the run.
	stored(ctx context.Context) (int64, error)
	// dedupName names the broker's own dedup in the report ("" when it has
	// none).
	dedupName() string
	close()
}

// natsBroker is NATS JetStream (embedded unless Config.NATSURL is set) with
// a stream of the run's own.
type natsBroker struct {
	url            string
	nc             *nats.Conn
	js             jetstream.JetStream
	stream, prefix string
	stop           func()
}

func startNATSBroker(ctx context.Context, cfg Config, work string, say func(string, ...any)) (*natsBroker, error) {
	b := &natsBroker{url: cfg.NATSURL, stop: func() {}}
	if b.url == "" {
		srv, u, err := natsserver.Start(natsserver.Config{StoreDir: filepath.Join(work, "nats"), Listen: "127.0.0.1:0"})
		if err != nil {
			return nil, err
		}
		b.stop = func() { srv.Shutdown(); srv.WaitForShutdown() }
		b.url = u
		say("embedded NATS JetStream listening on %s", u)
	} else {
		say("using NATS JetStream at %s", b.url)
	}
	var err error
	if b.nc, err = nats.Connect(b.url, nats.MaxReconnects(-1)); err != nil {
		b.stop()
		return nil, fmt.Errorf("demo: NATS %s: %w", b.url, err)
	}
	if b.js, err = jetstream.New(b.nc); err != nil {
		b.close()
		return nil, err
	}
	// A stream of its own per run, so that reruns on a shared server never
	// see another run's messages.
	suffix := randomHex(4)
	b.stream, b.prefix = "PGRELAY_DEMO_"+strings.ToUpper(suffix), "pgrelaydemo"+suffix
	if _, err := b.js.CreateStream(ctx, pgnats.StreamSpec{Name: b.stream, SubjectPrefix: b.prefix}.Config()); err != nil {
		b.close()
		return nil, fmt.Errorf("demo: create stream %s: %w", b.stream, err)
	}
	return b, nil
}

func (b *natsBroker) serviceEnv() (relay, consumer []string) {
	return []string{"NATS_URL=" + b.url, "RELAY_STREAM=" + b.stream, "RELAY_SUBJECT_PREFIX=" + b.prefix},
		[]string{"NATS_URL=" + b.url, "CONSUMER_STREAM=" + b.stream, "CONSUMER_SUBJECT_PREFIX=" + b.prefix,
			"CONSUMER_DURABLE=demo", "CONSUMER_ACK_WAIT=2s"}
}

func (b *natsBroker) publish(ctx context.Context, eventID, msgID, eventType string, payload []byte, key string) (bool, error) {
	m := nats.NewMsg(b.prefix + ".orders")
	m.Data = payload
	if eventID != "" {
		m.Header.Set(event.HeaderEventID, eventID)
	}
	if msgID != "" {
		m.Header.Set(pgnats.MsgIDHeader, msgID)
	}
	if eventType != "" {
		m.Header.Set(event.HeaderEventType, eventType)
	}
	m.Header.Set(event.HeaderTopic, "orders")
	if key != "" {
		m.Header.Set(event.HeaderKey, key)
	}
	m.Header.Set(event.HeaderOccurredAt, time.Now().UTC().Format(time.RFC3339Nano))
	ack, err := b.js.PublishMsg(ctx, m)
	if err != nil {
		return false, fmt.Errorf("demo: publish to NATS: %w", err)
	}
	return ack.Duplicate, nil
}

func (b *natsBroker) stored(ctx context.Context) (int64, error) {
	st, err := b.js.Stream(ctx, b.stream)
	if err != nil {
		return 0, err
	}
	si, err := st.Info(ctx)
	if err != nil {
		return 0, err
	}
	return int64(si.State.Msgs), nil
}

func (b *natsBroker) dedupName() string { return "JetStream" }

func (b *natsBroker) close() {
	if b.js != nil && b.stream != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = b.js.DeleteStream(ctx, b.stream)
	}
	if b.nc != nil {
		b.nc.Close()
	}
	b.stop()
}

// rabbitBroker is the RabbitMQ server at Config.AMQPURL with an exchange and
// a queue of the run's own, and an audit queue bound to the same exchange
// that nobody consumes: its length is the count of messages stored.
type rabbitBroker struct {
	url                    string
	exchange, queue, audit string
	conn                   *amqp.Connection
	ch                     *amqp.Channel
}

func startRabbitBroker(ctx context.Context, cfg Config, say func(string, ...any)) (*rabbitBroker, error) {
	base := "pgrelay-demo-" + randomHex(4)
	b := &rabbitBroker{url: cfg.AMQPURL, exchange: base, queue: base, audit: base + "-audit"}
	// The topology as the services declare it (a quorum queue where the
	// server has them), then the audit queue.
	pub, err := rabbitmq.NewPublisher(ctx, rabbitmq.Config{URL: b.url, Exchange: b.exchange, Queue: b.queue})
	if err != nil {
		return nil, fmt.Errorf("demo: RabbitMQ (--amqp-url, AMQP_URL): %w", err)
	}
	_ = pub.Close()
	if b.conn, err = amqp.DialConfig(b.url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)}); err != nil {
		return nil, fmt.Errorf("demo: RabbitMQ: %w", err)
	}
	if b.ch, err = b.conn.Channel(); err == nil {
		err = b.ch.Confirm(false)
	}
	if err == nil {
		_, err = b.ch.QueueDeclare(b.audit, true, false, false, false, nil)
	}
	if err == nil {
		err = b.ch.QueueBind(b.audit, "#", b.exchange, false, nil)
	}
	if err != nil {
		b.close()
		return nil, fmt.Errorf("demo: RabbitMQ audit queue: %w", err)
	}
	say("using RabbitMQ at %s: exchange %s, queue %s (and %s, counting what was stored)", rabbitmq.RedactURL(b.url), b.exchange, b.queue, b.audit)
	return b, nil
}

func (b *rabbitBroker) serviceEnv() (relay, consumer []string) {
	common := []string{"PGRELAY_BROKER=rabbitmq", "AMQP_URL=" + b.url, "AMQP_EXCHANGE=" + b.exchange, "AMQP_QUEUE=" + b.queue}
	return common, append(common, "AMQP_PREFETCH=200")
}

func (b *rabbitBroker) publish(ctx context.Context, eventID, msgID, eventType string, payload []byte, key string) (bool, error) {
	h := amqp.Table{event.HeaderTopic: "orders", event.HeaderOccurredAt: time.Now().UTC().Format(time.RFC3339Nano)}
	if eventID != "" {
		h[event.HeaderEventID] = eventID
	}
	if eventType != "" {
		h[event.HeaderEventType] = eventType
	}
	if key != "" {
		h[event.HeaderKey] = key
	}
	dc, err := b.ch.PublishWithDeferredConfirmWithContext(ctx, b.exchange, "orders", true, false,
		amqp.Publishing{Headers: h, MessageId: msgID, DeliveryMode: amqp.Persistent, Body: payload})
	if err != nil {
		return false, fmt.Errorf("demo: publish to RabbitMQ: %w", err)
	}
	ok, err := dc.WaitContext(ctx)
	if err == nil && !ok {
		err = errors.New("refused (basic.nack)")
	}
	if err != nil {
		return false, fmt.Errorf("demo: publish to RabbitMQ: %w", err)
	}
	return false, nil // RabbitMQ has no dedup
}

func (b *rabbitBroker) stored(context.Context) (int64, error) {
	q, err := b.ch.QueueDeclarePassive(b.audit, true, false, false, false, nil)
	if err != nil {
		return 0, err
	}
	return int64(q.Messages), nil
}

func (b *rabbitBroker) dedupName() string { return "" }

func (b *rabbitBroker) close() {
	if b.ch != nil && !b.ch.IsClosed() {
		_, _ = b.ch.QueueDelete(b.queue, false, false, false)
		_, _ = b.ch.QueueDelete(b.audit, false, false, false)
		_ = b.ch.ExchangeDelete(b.exchange, false, false)
	}
	if b.conn != nil {
		_ = b.conn.Close()
	}
}
