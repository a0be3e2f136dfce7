package chaos

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/internal/testnats"
)

// TestInvalidSettingsFailAtStartup runs the real relay and consumer binaries
// with one invalid setting at a time, from a flag or from the environment,
// against a reachable database and NATS: each must exit non-zero at start-up
// with a message naming the setting (flag and environment variable), never
// run on with it, never panic. A zero number or duration, and an empty name,
// select the documented default, so the invalid values here are negative or
// malformed.
func TestInvalidSettingsFailAtStartup(t *testing.T) {
	t.Parallel()
	bin := binaries(t)
	dbURL := testdb.NewURL(t)
	natsURL := testnats.URL(t)
	stream, prefix := testnats.Stream(t, natsURL)
	base := map[string][]string{
		"relay": {"DATABASE_URL=" + dbURL, "NATS_URL=" + natsURL, "RELAY_STREAM=" + stream, "RELAY_SUBJECT_PREFIX=" + prefix,
			"METRICS_ADDR=", "ADMIN_ADDR="},
		"consumer": {"DATABASE_URL=" + dbURL, "NATS_URL=" + natsURL, "CONSUMER_STREAM=" + stream, "CONSUMER_SUBJECT_PREFIX=" + prefix,
			"METRICS_ADDR=", "ADMIN_ADDR="},
	}
	cases := []struct {
		bin  string
		args []string // after "run"
		env  []string // added to the base environment
		want string   // the error must contain it
	}{
		{"relay", nil, []string{"DATABASE_URL="}, "--database-url (DATABASE_URL)"},
		{"relay", []string{"--database-url", "::not a url::"}, nil, "--database-url (DATABASE_URL)"},
		{"relay", []string{"--batch-size", "-1"}, nil, "--batch-size (RELAY_BATCH_SIZE)"},
		{"relay", []string{"--batch-size", "100000"}, nil, "--batch-size (RELAY_BATCH_SIZE)"},
		{"relay", []string{"--lease", "-1s"}, nil, "--lease (RELAY_LEASE)"},
		{"relay", []string{"--lease", "5s", "--heartbeat", "10s"}, nil, "--heartbeat (RELAY_HEARTBEAT)"},
		{"relay", []string{"--ack-timeout", "0s"}, nil, "--ack-timeout (RELAY_ACK_TIMEOUT)"},
		{"relay", []string{"--publish-timeout", "-1s"}, nil, "--publish-timeout (RELAY_PUBLISH_TIMEOUT)"},
		{"relay", []string{"--poll-interval", "-1s"}, nil, "--poll-interval (RELAY_POLL_INTERVAL)"},
		{"relay", []string{"--retention-batch", "-1"}, nil, "--retention-batch (RELAY_RETENTION_BATCH)"},
		{"relay", []string{"--retention-interval", "-1s"}, nil, "--retention-interval (RELAY_RETENTION_INTERVAL)"},
		{"relay", []string{"--log-level", "loud"}, nil, "loud"},
		{"relay", []string{"--log-format", "xml"}, nil, "xml"},
		{"relay", []string{"--batch-size", "lots"}, nil, "--batch-size"},
		{"relay", []string{"--capture", "trigger"}, nil, "--capture (RELAY_CAPTURE)"},
		{"relay", []string{"--capture", "wal", "--wal-slot", "Bad-Slot"}, nil, "--wal-slot (RELAY_WAL_SLOT)"},
		{"relay", nil, []string{"RELAY_BATCH_SIZE=lots"}, "RELAY_BATCH_SIZE"},
		{"relay", nil, []string{"RELAY_LEASE=soon"}, "RELAY_LEASE"},
		{"relay", nil, []string{"RELAY_CREATE_STREAM=maybe"}, "RELAY_CREATE_STREAM"},
		{"relay", nil, []string{"RELAY_MIGRATE=perhaps"}, "RELAY_MIGRATE"},
		{"relay", nil, []string{"RELAY_STREAM_MAX_AGE=long"}, "RELAY_STREAM_MAX_AGE"},
		{"consumer", nil, []string{"DATABASE_URL="}, "DATABASE_URL"},
		{"consumer", []string{"--batch-size", "-1"}, nil, "--batch-size (CONSUMER_BATCH_SIZE)"},
		{"consumer", []string{"--max-wait", "-1s"}, nil, "--max-wait (CONSUMER_MAX_WAIT)"},
		{"consumer", []string{"--ack-wait", "-1s"}, nil, "--ack-wait (CONSUMER_ACK_WAIT)"},
		{"consumer", []string{"--max-payload-bytes", "-1"}, nil, "--max-payload-bytes (CONSUMER_MAX_PAYLOAD_BYTES)"},
		{"consumer", []string{"--workers", "-1"}, nil, "--workers (CONSUMER_WORKERS)"},
		{"consumer", []string{"--worker-batch-size", "-1"}, nil, "CONSUMER_WORKER_BATCH_SIZE"},
		{"consumer", []string{"--max-attempts", "-1"}, nil, "--max-attempts (CONSUMER_MAX_ATTEMPTS)"},
		{"consumer", []string{"--lease", "-1s"}, nil, "--lease (CONSUMER_LEASE)"},
		{"consumer", []string{"--lease", "5s", "--handler-timeout", "10s"}, nil, "--handler-timeout (CONSUMER_HANDLER_TIMEOUT)"},
		{"consumer", []string{"--durable", "bad.name"}, nil, "--durable (CONSUMER_DURABLE)"},
		{"consumer", []string{"--stream", "bad.name"}, nil, "--stream (CONSUMER_STREAM)"},
		{"consumer", []string{"--metrics-addr", "not an address"}, nil, "METRICS_ADDR"},
		{"consumer", []string{"--dedup-window", "-1h"}, nil, "DEDUP_WINDOW"},
		{"consumer", []string{"--log-level", "loud"}, nil, "loud"},
		{"consumer", nil, []string{"CONSUMER_BATCH_SIZE=lots"}, "CONSUMER_BATCH_SIZE"},
		{"consumer", nil, []string{"CONSUMER_LEASE=soon"}, "CONSUMER_LEASE"},
		{"consumer", []string{"--ordered", "--gap-timeout", "-1s"}, nil, "--gap-timeout (CONSUMER_GAP_TIMEOUT)"},
		{"consumer", nil, []string{"CONSUMER_ORDERED=sometimes"}, "CONSUMER_ORDERED"},
		{"consumer", nil, []string{"CONSUMER_CREATE_STREAM=maybe"}, "CONSUMER_CREATE_STREAM"},
		{"consumer", nil, []string{"DEDUP_WINDOW=forever"}, "DEDUP_WINDOW"},
		{"consumer", []string{"--dedup-window", "30m"}, nil, "--dedup-window"},
		{"consumer", nil, []string{"CONSUMER_ALLOW_REPLAY_BEYOND_DEDUP_WINDOW=maybe"}, "CONSUMER_ALLOW_REPLAY_BEYOND_DEDUP_WINDOW"},
		// RabbitMQ: settings checked before any connection; a server that
		// cannot be reached named by its flag.
		{"relay", []string{"--broker", "rabbitmq"}, []string{"AMQP_URL="}, "--amqp-url (AMQP_URL)"},
		{"relay", []string{"--broker", "rabbitmq", "--amqp-url", "http://h/"}, nil, "--amqp-url (AMQP_URL)"},
		{"relay", []string{"--broker", "rabbitmq", "--amqp-url", "amqp://h/", "--amqp-confirm-timeout", "-1s"}, nil, "--amqp-confirm-timeout (AMQP_CONFIRM_TIMEOUT)"},
		{"relay", []string{"--broker", "rabbitmq", "--amqp-url", "amqp://h/", "--amqp-exchange", "amq.direct"}, nil, "--amqp-exchange (AMQP_EXCHANGE)"},
		{"relay", nil, []string{"PGRELAY_BROKER=rabbitmq", "AMQP_URL=amqp://h/", "AMQP_MAX_IN_FLIGHT=lots"}, "AMQP_MAX_IN_FLIGHT"},
		{"relay", nil, []string{"PGRELAY_BROKER=rabbitmq", "AMQP_URL=amqp://guest:secret@127.0.0.1:1/"}, "--amqp-url (AMQP_URL)"},
		{"consumer", []string{"--broker", "rabbitmq", "--amqp-url", "amqp://h/", "--amqp-prefetch", "-1"}, nil, "--amqp-prefetch (AMQP_PREFETCH)"},
		{"consumer", []string{"--broker", "rabbitmq", "--amqp-url", "amqp://h/", "--amqp-prefetch", "10"}, nil, "--batch-size (CONSUMER_BATCH_SIZE)"},
		{"consumer", []string{"--broker", "rabbitmq", "--amqp-url", "amqp://h/", "--amqp-queue-type", "lazy"}, nil, "--amqp-queue-type (AMQP_QUEUE_TYPE)"},
		{"consumer", nil, []string{"PGRELAY_BROKER=rabbitmq", "AMQP_URL=amqp://h/", "AMQP_SKIP_DECLARE=maybe"}, "AMQP_SKIP_DECLARE"},
		{"consumer", nil, []string{"PGRELAY_BROKER=rabbitmq", "AMQP_URL=amqp://guest:secret@127.0.0.1:1/"}, "--amqp-url (AMQP_URL)"},
		{"consumer", []string{"--dedup-key", "business:payment:{order_id"}, nil, "--dedup-key (CONSUMER_DEDUP_KEY)"},
		{"consumer", []string{"--dedup-key", "sha1"}, nil, "--dedup-key (CONSUMER_DEDUP_KEY)"},
		{"consumer", nil, []string{"CONSUMER_DEDUP_KEY=hybrid:content-hash"}, "--dedup-key (CONSUMER_DEDUP_KEY)"},
		{"consumer", []string{"--dedup-key-topic", "payments"}, nil, "--dedup-key-topic (CONSUMER_DEDUP_KEY_TOPICS)"},
		{"consumer", []string{"--dedup-key-topic", "payments=business:"}, nil, "--dedup-key-topic (CONSUMER_DEDUP_KEY_TOPICS)"},
		{"consumer", []string{"--handler-name", "Not A Name"}, nil, "--handler-name (CONSUMER_HANDLER_NAME)"},
	}
	for _, c := range cases {
		name := c.bin + " " + strings.Join(append(append([]string{}, c.args...), c.env...), " ")
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, filepath.Join(bin, c.bin), append([]string{"run"}, c.args...)...)
			cmd.Env = append(append(os.Environ(), base[c.bin]...), c.env...)
			out, err := cmd.CombinedOutput()
			require.Error(t, err, "%s started with an invalid setting:\n%s", name, out)
			require.NotErrorIs(t, ctx.Err(), context.DeadlineExceeded, "%s did not fail at start-up", name)
			require.Contains(t, string(out), c.want, "%s: the error must name the setting", name)
			require.NotContains(t, string(out), "panic:", name)
		})
	}
}
