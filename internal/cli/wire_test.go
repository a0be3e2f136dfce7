package cli

import (
	"context"
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/pgrelay/pgrelay/broker"
)

// plainSide is a relay side that cannot publish CloudEvents.
type plainSide struct{}

func (plainSide) Check() error                                            { return nil }
func (plainSide) Open(context.Context, *zap.Logger) (*RelayBroker, error) { return nil, nil }

// TestApplyWire: the wire settings reach the side of every broker that
// offers them, into its adapter's config; a broker that cannot publish
// CloudEvents refuses --wire-format cloudevents, naming it.
func TestApplyWire(t *testing.T) {
	fs := pflag.NewFlagSet("relay", pflag.ContinueOnError)
	sides := BindRelaySides(fs, Brokers())
	w := Wire{Format: "cloudevents", Source: "/billing"}
	for name, side := range sides {
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
