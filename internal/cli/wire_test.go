package cli

import (
	"context"
	"log/slog"
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/rabbitmq"
)

// plainSide is a relay side that cannot publish CloudEvents.
type plainSide struct{}

func (plainSide) Check() error                                             { return nil }
func (plainSide) Open(context.Context, *slog.Logger) (*RelayBroker, error) { return nil, nil }

// TestApplyWire: the wire settings reach the side of every broker that
// offers them, into its adapter's config; a broker that cannot publish
// CloudEvents refuses --wire-format cloudevents, naming it.
func TestApplyWire(t *testing.T) {
	fs := pflag.NewFlagSet("relay", pflag.ContinueOnError)
	sides := BindRelaySides(fs, Brokers())
	w := Wire{Format: "cloudevents", Source: "/billing"}
	for name, side := range sides {
		if name == "postgres" {
			// No wire: the relay stores events straight into the inbox.
			require.EqualError(t, ApplyWire(side, name, w),
				"--wire-format (RELAY_WIRE_FORMAT) cloudevents: --broker postgres cannot publish CloudEvents")
			continue
		}
		require.NoError(t, ApplyWire(side, name, w), name)
	}
	require.Equal(t, broker.WireCloudEvents, sides["nats"].(*natsRelay).config("nats://x", false, nil).WireFormat)
	require.Equal(t, "/billing", sides["nats"].(*natsRelay).config("nats://x", false, nil).CloudEventsSource)
	require.Equal(t, broker.WireCloudEvents, sides["kafka"].(*kafkaSettings).config(nil).WireFormat)
	require.Equal(t, "/billing", sides["rabbitmq"].(*rabbitMQRelay).config(nil).CloudEventsSource)

	require.NoError(t, ApplyWire(plainSide{}, "carrier-pigeon", Wire{Format: "pgrelay"}))
	require.EqualError(t, ApplyWire(plainSide{}, "carrier-pigeon", w),
		"--wire-format (RELAY_WIRE_FORMAT) cloudevents: --broker carrier-pigeon cannot publish CloudEvents")
}

// TestCloudEventsAMQPPrefixFlag: --ce-amqp-prefix (RELAY_CE_AMQP_PREFIX)
// reaches the RabbitMQ publisher's config ("cloudEvents_" by default, or
// "cloudEvents:" for the CloudEvents Go SDK's AMQP binding); any other value
// fails at start-up, naming the flag.
func TestCloudEventsAMQPPrefixFlag(t *testing.T) {
	relay := func(args ...string) *rabbitMQRelay {
		f := pflag.NewFlagSet("relay", pflag.ContinueOnError)
		side := RabbitMQBroker().BindRelay(f)
		require.NoError(t, f.Parse(append([]string{"--amqp-url", "amqp://h/"}, args...)))
		require.NoError(t, ApplyWire(side, "rabbitmq", Wire{Format: "cloudevents", Source: "pgrelay"}))
		return side.(*rabbitMQRelay)
	}
	require.NoError(t, relay().Check())
	require.Equal(t, rabbitmq.CloudEventsPrefixUnderscore, relay().config(nil).CloudEventsPrefix)
	require.NoError(t, relay("--ce-amqp-prefix", "cloudEvents:").Check())
	require.Equal(t, rabbitmq.CloudEventsPrefixColon, relay("--ce-amqp-prefix", "cloudEvents:").config(nil).CloudEventsPrefix)
	require.ErrorContains(t, relay("--ce-amqp-prefix", "ce-").Check(), `--ce-amqp-prefix (RELAY_CE_AMQP_PREFIX) "ce-": want "cloudEvents_" or "cloudEvents:"`)

	t.Setenv("RELAY_CE_AMQP_PREFIX", "cloudEvents:")
	require.Equal(t, rabbitmq.CloudEventsPrefixColon, relay().config(nil).CloudEventsPrefix)
	t.Setenv("RELAY_CE_AMQP_PREFIX", "cloudevents:")
	require.ErrorContains(t, relay().Check(), "--ce-amqp-prefix (RELAY_CE_AMQP_PREFIX)")
}
