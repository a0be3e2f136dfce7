package cli

import (
	"context"
	"log/slog"
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"
)

// TestRabbitMQFlagsNameTheSetting: bad RabbitMQ settings fail before any
// connection, naming the flag and its environment variable; good ones are
// accepted; a server that cannot be reached is reported with --amqp-url and
// without the password.
func TestRabbitMQFlagsNameTheSetting(t *testing.T) {
	t.Parallel()
	relay := func(args ...string) RelaySide {
		f := pflag.NewFlagSet("relay", pflag.ContinueOnError)
		side := RabbitMQBroker().BindRelay(f)
		require.NoError(t, f.Parse(args))
		return side
	}
	consumer := func(args ...string) ConsumerSide {
		f := pflag.NewFlagSet("consumer", pflag.ContinueOnError)
		side := RabbitMQBroker().BindConsumer(f)
		require.NoError(t, f.Parse(args))
		return side
	}
	opts := SubscriberOptions{BatchSize: 100, Logger: slog.New(slog.DiscardHandler),
		Options: Options{{Flag: "batch-size", Env: "CONSUMER_BATCH_SIZE", Field: "FetchBatchSize"}}}
	require.ErrorContains(t, consumer().Check(opts), "--amqp-url (AMQP_URL) is required")
	require.ErrorContains(t, consumer("--amqp-url", "amqp://h/", "--amqp-prefetch", "-1").Check(opts), "--amqp-prefetch (AMQP_PREFETCH)")
	require.ErrorContains(t, consumer("--amqp-url", "amqp://h/", "--amqp-prefetch", "50").Check(opts), "is below --batch-size (CONSUMER_BATCH_SIZE)")
	require.ErrorContains(t, relay("--amqp-url", "amqp://h/", "--amqp-queue-type", "lazy").Check(), "--amqp-queue-type (AMQP_QUEUE_TYPE)")
	require.ErrorContains(t, relay("--amqp-url", "amqp://h/", "--amqp-confirm-timeout", "-1s").Check(), "--amqp-confirm-timeout (AMQP_CONFIRM_TIMEOUT)")
	require.ErrorContains(t, relay("--amqp-url", "http://h/").Check(), "--amqp-url (AMQP_URL)")
	require.ErrorContains(t, relay("--amqp-url", "amqp://h/", "--amqp-exchange", "amq.topic").Check(), "--amqp-exchange (AMQP_EXCHANGE)")
	require.ErrorContains(t, relay("--amqp-url", "amqp://h/", "--amqp-max-message-bytes", "-5").Check(), "--amqp-max-message-bytes (AMQP_MAX_MESSAGE_BYTES)")
	require.NoError(t, relay("--amqp-url", "amqp://h/", "--amqp-max-in-flight", "7", "--amqp-skip-declare").Check())
	require.NoError(t, consumer("--amqp-url", "amqps://u:p@h:5671/v", "--amqp-prefetch", "100").Check(opts))

	_, err := relay("--amqp-url", "amqp://guest:secret@127.0.0.1:1/").Open(context.Background(), slog.New(slog.DiscardHandler))
	require.ErrorContains(t, err, "--amqp-url (AMQP_URL)")
	require.NotContains(t, err.Error(), "secret")
}
