package cli

import (
	"fmt"

	"github.com/spf13/pflag"

	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/rabbitmq"
)

// The flags (and environment variables) of the relay's wire format.
const (
	WireFormatFlag = "--wire-format (RELAY_WIRE_FORMAT)"
	CESourceFlag   = "--ce-source (RELAY_CE_SOURCE)"
	// CEAMQPPrefixFlag is --broker rabbitmq's CloudEvents attribute prefix.
	CEAMQPPrefixFlag = "--ce-amqp-prefix (RELAY_CE_AMQP_PREFIX)"
)

// Wire is the relay's wire format settings, whatever the broker.
type Wire struct {
	// Format is --wire-format: pgrelay or cloudevents.
	Format string
	// Source is --ce-source: the CloudEvents source attribute.
	Source string
}

// BindWireFlags adds --wire-format (RELAY_WIRE_FORMAT) and --ce-source
// (RELAY_CE_SOURCE) to f.
func BindWireFlags(f *pflag.FlagSet, w *Wire) {
	f.StringVar(&w.Format, "wire-format", EnvString("RELAY_WIRE_FORMAT", string(broker.WirePgrelay)),
		"how events are laid out on the broker: pgrelay (Pgrelay-* headers) or cloudevents (CloudEvents 1.0 binary mode of the broker's binding: NATS ce-, Kafka ce_, AMQP cloudEvents_ headers); consumers read both (env RELAY_WIRE_FORMAT)")
	f.StringVar(&w.Source, "ce-source", EnvString("RELAY_CE_SOURCE", broker.DefaultCloudEventsSource),
		"--wire-format cloudevents: the CloudEvents source attribute of every event, a URI-reference such as /billing or urn:example:orders (env RELAY_CE_SOURCE)")
}

// bindCEAMQPPrefix adds --ce-amqp-prefix (RELAY_CE_AMQP_PREFIX), the
// RabbitMQ relay's CloudEvents attribute prefix, to f; its Config.Validate
// checks it at start-up.
func bindCEAMQPPrefix(f *pflag.FlagSet, prefix *string) {
	f.StringVar(prefix, "ce-amqp-prefix", EnvString("RELAY_CE_AMQP_PREFIX", rabbitmq.CloudEventsPrefixUnderscore),
		"--broker rabbitmq --wire-format cloudevents: prefix of the CloudEvents attribute headers, cloudEvents_ (the AMQP binding's) or cloudEvents: (the one the CloudEvents Go SDK's AMQP binding reads); consumers read both (env RELAY_CE_AMQP_PREFIX)")
}

// WireSide is a RelaySide whose publisher can lay events out in another
// wire format.
type WireSide interface {
	// SetWire sets the publisher's wire format and CloudEvents source,
	// before Check and Open.
	SetWire(format broker.WireFormat, source string)
}

// ApplyWire checks w and hands it to side (the relay side of the broker
// brokerName); errors name the flags. A broker whose side cannot publish
// CloudEvents refuses --wire-format cloudevents.
func ApplyWire(side RelaySide, brokerName string, w Wire) error {
	f := broker.WireFormat(w.Format)
	if err := broker.CheckWireFormat(f); err != nil {
		return fmt.Errorf("%s: %w", WireFormatFlag, err)
	}
	if f == broker.WireCloudEvents || w.Source != "" {
		if err := broker.CheckCloudEventsSource(w.Source); err != nil {
			return fmt.Errorf("%s: %w", CESourceFlag, err)
		}
	}
	if ws, ok := side.(WireSide); ok {
		ws.SetWire(f, w.Source)
		return nil
	}
	if f == broker.WireCloudEvents {
		return fmt.Errorf("%s %s: --broker %s cannot publish CloudEvents", WireFormatFlag, f, brokerName)
	}
	return nil
}
