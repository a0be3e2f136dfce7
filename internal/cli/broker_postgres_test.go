package cli

import (
	"context"
	"log/slog"
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"
)

// TestPostgresFlagsNameTheSetting: --broker postgres defaults its target to
// the relay's database, names its flags in errors, and its consumer side is
// direct (no subscriber), with the topics given.
func TestPostgresFlagsNameTheSetting(t *testing.T) {
	t.Parallel()
	relay := func(args ...string) RelaySide {
		f := pflag.NewFlagSet("relay", pflag.ContinueOnError)
		side := PostgresBroker().BindRelay(f)
		require.NoError(t, f.Parse(args))
		return side
	}
	require.ErrorContains(t, relay().Check(), "--pg-target-url (PG_TARGET_URL) is required")
	r := relay()
	r.(DatabaseDefault).DefaultDatabase("postgres://u@127.0.0.1:1/db")
	require.NoError(t, r.Check())
	require.ErrorContains(t, relay("--pg-target-url", "postgres://h/db", "--pg-max-conns", "0").Check(), "--pg-max-conns (PG_MAX_CONNS)")
	require.ErrorContains(t, relay("--pg-target-url", "postgres://h/db", "--pg-max-message-bytes", "-1").Check(), "--pg-max-message-bytes (PG_MAX_MESSAGE_BYTES)")
	_, err := r.Open(context.Background(), slog.New(slog.DiscardHandler))
	require.ErrorContains(t, err, "--pg-target-url (PG_TARGET_URL)")

	f := pflag.NewFlagSet("consumer", pflag.ContinueOnError)
	c := PostgresBroker().BindConsumer(f)
	require.NoError(t, f.Parse([]string{"--pg-topics", "orders, payments,"}))
	require.NoError(t, c.Check(SubscriberOptions{}))
	require.Nil(t, c.Subscribe(SubscriberOptions{}))
	require.Equal(t, []string{"orders", "payments"}, c.(*postgresConsumer).topics())
}
