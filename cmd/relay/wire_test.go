package main

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWireSettingsNameTheSetting: a bad --wire-format or --ce-source (flag
// or environment) fails at start-up naming the setting; valid ones pass the
// check for every broker.
func TestWireSettingsNameTheSetting(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	ctx := context.Background()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--wire-format", "json"}, `--wire-format (RELAY_WIRE_FORMAT): "json" is not a wire format: want pgrelay or cloudevents`},
		{[]string{"--wire-format", "cloudevents", "--ce-source", "has space"}, "--ce-source (RELAY_CE_SOURCE)"},
		{[]string{"--wire-format", "cloudevents", "--ce-source", ""}, "--ce-source (RELAY_CE_SOURCE): must not be empty"},
		{[]string{"--broker", "kafka", "--kafka-brokers", "127.0.0.1:1", "--wire-format", "CloudEvents"}, "--wire-format (RELAY_WIRE_FORMAT)"},
	} {
		args := append([]string{"run", "--database-url", "postgres://x"}, c.args...)
		require.ErrorContains(t, execute(ctx, args...), c.want, "%v", c.args)
	}
	t.Setenv("RELAY_WIRE_FORMAT", "xml")
	require.ErrorContains(t, execute(ctx, "run", "--database-url", "postgres://x"), "--wire-format (RELAY_WIRE_FORMAT)")
	t.Setenv("RELAY_WIRE_FORMAT", "cloudevents")
	t.Setenv("RELAY_CE_SOURCE", "caf\u00e9")
	require.ErrorContains(t, execute(ctx, "run", "--database-url", "postgres://x"), "--ce-source (RELAY_CE_SOURCE)")
	t.Setenv("RELAY_CE_SOURCE", "/billing")
	for _, b := range [][]string{{"--broker", "nats"}, {"--broker", "kafka", "--kafka-brokers", "127.0.0.1:1"},
		{"--broker", "rabbitmq", "--amqp-url", "amqp://127.0.0.1:1/"}} {
		err := execute(ctx, append([]string{"run", "--database-url", "::not a url::"}, b...)...)
		require.ErrorContains(t, err, "--database-url (DATABASE_URL)", "%v: the wire settings pass, the next check fails", b)
	}
}
