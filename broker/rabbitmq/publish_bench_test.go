package rabbitmq_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/broker/brokertest"
	"github.com/pgrelay/pgrelay/broker/rabbitmq"
	"github.com/pgrelay/pgrelay/internal/testamqp"
)

// BenchmarkPublishBatch: brokertest.BenchmarkPublish against the local
// RabbitMQ, with confirms, into a durable queue bound to every topic.
func BenchmarkPublishBatch(b *testing.B) {
	u := testamqp.URL(b)
	x, q := testamqp.Names(b, u)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := rabbitmq.NewPublisher(ctx, rabbitmq.Config{URL: u, Exchange: x, Queue: q})
	require.NoError(b, err)
	b.Cleanup(func() { _ = p.Close() })
	brokertest.BenchmarkPublish(b, p, "orders")
}
