package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestBrokerSetting: -broker names a broker the relay drains know, and a bad
// one is refused naming the flag.
func TestBrokerSetting(t *testing.T) {
	t.Parallel()
	base := Config{DatabaseURL: "postgres://x"}
	require.NoError(t, base.WithDefaults().validate())
	require.Equal(t, "nats", base.WithDefaults().Broker)

	bad := base
	bad.Broker = "carrier-pigeon"
	require.ErrorContains(t, bad.WithDefaults().validate(), `Broker (-broker) "carrier-pigeon": want kafka or nats`)

	cfg := base
	cfg.Broker = "nats"
	cfg.Only = []string{"relay", "inbox"}
	require.NoError(t, cfg.WithDefaults().validate(), "NATS runs every group")

	k := base
	k.Broker = "kafka"
	require.ErrorContains(t, k.WithDefaults().validate(), "add -only relay")
	k.Only = []string{"relay"}
	require.NoError(t, k.WithDefaults().validate())
}
