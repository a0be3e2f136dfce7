package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/rabbitmq"
	"github.com/pgrelay/pgrelay/internal/logbridge"
)

// rabbitMQTarget is a fresh exchange and quorum queue (where the server has
// them) on the RabbitMQ at AMQP_URL (default the local one, guest/guest).
type rabbitMQTarget struct {
	b               *bench
	url             string
	exchange, queue string
}

func newRabbitMQTarget(ctx context.Context, b *bench) (relayTarget, error) {
	url := os.Getenv("AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	buf := make([]byte, 4)
	_, _ = rand.Read(buf)
	name := "pgrelay-bench-" + hex.EncodeToString(buf)
	t := &rabbitMQTarget{b: b, url: url, exchange: name, queue: name}
	// Declare the topology once, before the relays start.
	p, err := t.newPublisher(ctx)
	if err != nil {
		return nil, err
	}
	_ = p.Close()
	return t, nil
}

func (t *rabbitMQTarget) newPublisher(ctx context.Context) (broker.Publisher, error) {
	p, err := rabbitmq.NewPublisher(ctx, rabbitmq.Config{URL: t.url, Exchange: t.exchange, Queue: t.queue,
		Logger: logbridge.AtLeast(t.b.log.With(slog.String("logger", "rabbitmq")), slog.LevelError)})
	if err != nil {
		return nil, fmt.Errorf("RabbitMQ (AMQP_URL): %w", err)
	}
	return p, nil
}

// channel opens a connection and channel for an inspection or clean-up.
func (t *rabbitMQTarget) channel() (*amqp.Connection, *amqp.Channel, error) {
	conn, err := amqp.DialConfig(t.url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		return nil, nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		_ = conn.Close()
		return nil, nil, err
	}
	return conn, ch, nil
}

func (t *rabbitMQTarget) stored(context.Context) (uint64, error) {
	conn, ch, err := t.channel()
	if err != nil {
		return 0, err
	}
	defer func() { _ = conn.Close() }()
	q, err := ch.QueueDeclarePassive(t.queue, true, false, false, false, nil)
	if err != nil {
		return 0, fmt.Errorf("queue %s: %w", t.queue, err)
	}
	return uint64(q.Messages), nil
}

func (t *rabbitMQTarget) drop() {
	conn, ch, err := t.channel()
	if err != nil {
		return
	}
	defer func() { _ = conn.Close() }()
	_, _ = ch.QueueDelete(t.queue, false, false, false)
	_ = ch.ExchangeDelete(t.exchange, false, false)
}
