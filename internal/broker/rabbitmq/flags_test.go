package rabbitmq_test

import (
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/pgrelay/pgrelay/internal/broker/rabbitmq"
)

// TestFlagsNameTheSetting: bad values fail naming the flag and its
// environment variable; good ones land in the Config.
func TestFlagsNameTheSetting(t *testing.T) {
	t.Parallel()
	parse := func(side string, args ...string) (rabbitmq.Config, error) {
		f := pflag.NewFlagSet("test", pflag.ContinueOnError)
		fl := rabbitmq.BindFlags(f, side)
		require.NoError(t, f.Parse(args))
		return fl.Config(zap.NewNop())
	}
	_, err := parse(rabbitmq.SideConsumer)
	require.ErrorContains(t, err, "--amqp-url (AMQP_URL) is required")
	_, err = parse(rabbitmq.SideConsumer, "--amqp-url", "amqp://h/", "--amqp-prefetch", "-1")
	require.ErrorContains(t, err, "--amqp-prefetch (AMQP_PREFETCH)")
	_, err = parse(rabbitmq.SideRelay, "--amqp-url", "amqp://h/", "--amqp-queue-type", "lazy")
	require.ErrorContains(t, err, "--amqp-queue-type (AMQP_QUEUE_TYPE)")
	_, err = parse(rabbitmq.SideRelay, "--amqp-url", "amqp://h/", "--amqp-confirm-timeout", "-1s")
	require.ErrorContains(t, err, "--amqp-confirm-timeout (AMQP_CONFIRM_TIMEOUT)")
	_, err = parse(rabbitmq.SideRelay, "--amqp-url", "http://h/")
	require.ErrorContains(t, err, "--amqp-url (AMQP_URL)")

	cfg, err := parse(rabbitmq.SideRelay, "--amqp-url", "amqp://h/", "--amqp-exchange", "x", "--amqp-queue", "q",
		"--amqp-max-in-flight", "7", "--amqp-max-message-bytes", "1000", "--amqp-skip-declare")
	require.NoError(t, err)
	require.Equal(t, "x", cfg.Exchange)
	require.Equal(t, "q", cfg.Queue)
	require.Equal(t, 7, cfg.MaxInFlight)
	require.Equal(t, 1000, cfg.MaxMessageBytes)
	require.True(t, cfg.SkipDeclare)
	cfg, err = parse(rabbitmq.SideConsumer, "--amqp-url", "amqp://h/", "--amqp-prefetch", "50")
	require.NoError(t, err)
	require.Equal(t, 50, cfg.Prefetch)
	require.Equal(t, "#", cfg.BindingKey)
}
