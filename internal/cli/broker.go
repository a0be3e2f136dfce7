package cli

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/internal/setting"
)

// BrokerEnv is the environment variable behind --broker.
const BrokerEnv = "PGRELAY_BROKER"

// DefaultBroker is the broker used when --broker is not given.
const DefaultBroker = "nats"

// Broker is one message broker the relay and consumer commands can use:
// --broker <Name> selects it. Each adapter contributes one in Brokers, with
// its settings as its own flags (each with an environment variable) bound by
// BindRelay and BindConsumer.
type Broker struct {
	// Name is the --broker value that selects the broker.
	Name string
	// BindRelay adds the broker's relay flags to fs and returns the relay
	// side, which reads them once parsed.
	BindRelay func(fs *pflag.FlagSet) RelaySide
	// BindConsumer adds the broker's consumer flags to fs and returns the
	// consumer side, which reads them once parsed.
	BindConsumer func(fs *pflag.FlagSet) ConsumerSide
}

// Brokers lists the brokers the commands offer. An adapter adds itself
// here.
func Brokers() []Broker {
	return []Broker{NATSBroker(), RabbitMQBroker(), KafkaBroker(), PostgresBroker()}
}

// RelaySide builds the relay's publisher from a broker's settings.
type RelaySide interface {
	// Check validates the settings without connecting; errors name the
	// flags and environment variables to fix.
	Check() error
	// Open connects (starting whatever the broker runs in process) and
	// returns the publisher; errors name the settings to fix.
	Open(ctx context.Context, log *slog.Logger) (*RelayBroker, error)
}

// RelayBroker is an open relay side.
type RelayBroker struct {
	// Publisher is what the relay publishes through.
	Publisher broker.Publisher
	// Healthy is the broker's readiness check (/readyz): nil while connected.
	Healthy func(context.Context) error
	// Close releases the publisher and whatever Open started.
	Close func()
}

// SubscriberOptions are the consumer's settings a subscriber needs, whatever
// the broker.
type SubscriberOptions struct {
	// BatchSize is the consumer's fetch size (a bound on what the broker
	// hands out unacknowledged is derived from it).
	BatchSize int
	// DedupWindow is the inbox's dedup window (--dedup-window): how far back
	// a redelivery is still recognised.
	DedupWindow time.Duration
	// MaxPayloadBytes is the largest accepted payload; a larger message is
	// stored dead.
	MaxPayloadBytes int
	// HandlerName is the consumer's handler name (--handler-name): a NATS
	// durable not set explicitly is named after it.
	HandlerName string
	// Logger receives the subscriber's logs.
	Logger *slog.Logger
	// Options are the consumer's, naming BatchSize (FetchBatchSize),
	// DedupWindow (Inbox.Retention.Window) and MaxPayloadBytes in errors.
	Options Options
}

// names spells the subscriber settings err's *setting.FieldErrors name:
// those SubscriberOptions carry as the consumer's options, the others by
// flags.
func (o SubscriberOptions) names(err error, flags map[string]string) error {
	return setting.Name(err, "", func(f string) string {
		switch f {
		case "MaxAckPending":
			return "10 × " + o.Options.Name("FetchBatchSize")
		case "DedupWindow":
			return o.Options.Name("Inbox.Retention.Window")
		case "MaxPayloadBytes":
			return o.Options.Name("MaxPayloadBytes")
		}
		return flags[f]
	})
}

// ConsumerSide builds the consumer's subscriber from a broker's settings.
type ConsumerSide interface {
	// Check validates the settings without connecting; errors name the
	// flags and environment variables to fix.
	Check(opts SubscriberOptions) error
	// Subscribe returns the function the consumer creates its subscriber
	// with (pgrelay.ConsumerConfig.Subscribe).
	Subscribe(opts SubscriberOptions) func(context.Context) (broker.Subscriber, error)
}

// BindBrokerFlag adds --broker (env PGRELAY_BROKER) to fs, naming the
// offered brokers in its help.
func BindBrokerFlag(fs *pflag.FlagSet, p *string, brokers []Broker) {
	names := make([]string, len(brokers))
	for i, b := range brokers {
		names[i] = b.Name
	}
	fs.StringVar(p, "broker", EnvString(BrokerEnv, DefaultBroker),
		fmt.Sprintf("message broker: %s; each has its own flags below (env %s)", strings.Join(names, ", "), BrokerEnv))
}

// BindRelaySides binds every broker's relay flags on fs.
func BindRelaySides(fs *pflag.FlagSet, brokers []Broker) map[string]RelaySide {
	sides := map[string]RelaySide{}
	for _, b := range brokers {
		if b.BindRelay != nil {
			sides[b.Name] = b.BindRelay(fs)
		}
	}
	return sides
}

// BindConsumerSides binds every broker's consumer flags on fs.
func BindConsumerSides(fs *pflag.FlagSet, brokers []Broker) map[string]ConsumerSide {
	sides := map[string]ConsumerSide{}
	for _, b := range brokers {
		if b.BindConsumer != nil {
			sides[b.Name] = b.BindConsumer(fs)
		}
	}
	return sides
}

// SelectBroker returns the side --broker names, or an error naming the flag
// and the brokers offered.
func SelectBroker[T any](name string, sides map[string]T) (T, error) {
	if s, ok := sides[name]; ok {
		return s, nil
	}
	names := make([]string, 0, len(sides))
	for n := range sides {
		names = append(names, n)
	}
	slices.Sort(names)
	var zero T
	return zero, fmt.Errorf("--broker (%s) %q: want %s", BrokerEnv, name, strings.Join(names, " or "))
}
