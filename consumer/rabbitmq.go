package consumer

import (
	"context"

	"github.com/pgrelay/pgrelay/internal/broker/rabbitmq"
)

// RabbitMQConfig configures pgrelay's RabbitMQ adapter: the server (URL),
// the durable topic exchange the relay publishes to (routing key = topic),
// the durable queue bound to it (a quorum queue where the server supports
// them) and the consumer's prefetch. Zero fields take the defaults it
// documents. See docs/rabbitmq.md.
type RabbitMQConfig = rabbitmq.Config

// SubscribeRabbitMQ returns a ConsumerConfig.Subscribe that consumes
// cfg.Queue on RabbitMQ with manual acknowledgements (each delivery is
// acknowledged after its inbox transaction committed) and cfg.Prefetch
// unacknowledged deliveries at most. A payload over maxPayloadBytes (0: no
// limit) is stored dead. The topology is declared unless cfg.SkipDeclare.
//
// RabbitMQ has no dedup window: an event the relay publishes twice (after a
// crash between publish and mark) is delivered twice, and the inbox stores
// it once.
func SubscribeRabbitMQ(cfg RabbitMQConfig, maxPayloadBytes int) func(context.Context) (Subscriber, error) {
	return func(ctx context.Context) (Subscriber, error) {
		return rabbitmq.NewSubscriber(ctx, cfg, maxPayloadBytes)
	}
}
