package main

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"

	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/nats"
	"github.com/pgrelay/pgrelay/internal/logbridge"
)

// relayTarget is a fresh destination of one relay drain on the -broker
// broker: the relays publish to it, and the drain checks what it holds.
type relayTarget interface {
	// newPublisher returns a publisher to the target; each relay has its own.
	newPublisher(ctx context.Context) (broker.Publisher, error)
	// stored returns how many messages the target holds.
	stored(ctx context.Context) (uint64, error)
	// drop deletes the target.
	drop()
}

// relayTargets maps each -broker value onto how the relay drains get their
// targets. An adapter adds itself here.
func relayTargets() map[string]func(ctx context.Context, b *bench) (relayTarget, error) {
	return map[string]func(ctx context.Context, b *bench) (relayTarget, error){
		"nats":     newNATSTarget,
		"rabbitmq": newRabbitMQTarget,
		"kafka":    newKafkaTarget,
		"postgres": newPostgresTarget,
	}
}

// checkBroker validates -broker: a broker the relay drains know. The other
// groups (floors, e2e, inbox, cost) measure NATS and the real binaries
// against NATS only, so another broker runs the relay group alone.
func (c Config) checkBroker() error {
	targets := relayTargets()
	if _, ok := targets[c.Broker]; !ok {
		return fmt.Errorf("bench: Broker (-broker) %q: want %s", c.Broker, strings.Join(slices.Sorted(maps.Keys(targets)), " or "))
	}
	if c.Broker != "nats" && !slices.Equal(c.Only, []string{"relay"}) {
		return fmt.Errorf("bench: Broker (-broker) %s measures the relay drains only: add -only relay", c.Broker)
	}
	return nil
}

// natsTarget is a fresh JetStream stream over a fresh subject prefix.
type natsTarget struct {
	b              *bench
	stream, prefix string
}

func newNATSTarget(ctx context.Context, b *bench) (relayTarget, error) {
	stream, prefix, err := b.nats.stream(ctx)
	if err != nil {
		return nil, err
	}
	return &natsTarget{b: b, stream: stream, prefix: prefix}, nil
}

func (t *natsTarget) newPublisher(ctx context.Context) (broker.Publisher, error) {
	return nats.NewPublisher(ctx, nats.Config{URL: t.b.nats.url, SubjectPrefix: t.prefix, Stream: t.stream,
		// The publisher reports its own close as a disconnection.
		Logger: logbridge.AtLeast(t.b.log.With(slog.String("logger", "nats")), slog.LevelError)})
}

func (t *natsTarget) stored(ctx context.Context) (uint64, error) {
	info, err := t.b.nats.js.Stream(ctx, t.stream)
	if err != nil {
		return 0, fmt.Errorf("stream info: %w", err)
	}
	return info.CachedInfo().State.Msgs, nil
}

func (t *natsTarget) drop() { t.b.nats.dropStream(t.stream) }
