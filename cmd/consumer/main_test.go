package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/cli/clitest"
)

// run executes the command line and returns its error.
func run(t *testing.T, args ...string) error {
	t.Helper()
	cmd := newRootCommand()
	cmd.SetArgs(args)
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	return cmd.Execute()
}

// TestBadSettingsNameTheSetting checks that every bad setting stops the
// consumer at start-up with an error naming the flag or variable to fix.
func TestBadSettingsNameTheSetting(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	require.ErrorContains(t, run(t, "run"), "--database-url (DATABASE_URL) is required")

	t.Setenv("DATABASE_URL", "postgres://127.0.0.1:1/none")
	t.Setenv("CONSUMER_BATCH_SIZE", "many")
	require.ErrorContains(t, run(t, "run"), `invalid CONSUMER_BATCH_SIZE="many"`)
	t.Setenv("CONSUMER_BATCH_SIZE", "100")

	t.Setenv("DEDUP_WINDOW", "forever")
	require.ErrorContains(t, run(t, "run"), `invalid DEDUP_WINDOW="forever"`)
	t.Setenv("DEDUP_WINDOW", "168h")

	require.ErrorContains(t, run(t, "run", "--stream", "a.b"), "--stream (CONSUMER_STREAM)")
	require.ErrorContains(t, run(t, "run", "--dedup-record-max", "0"), "--dedup-record-max (DEDUP_RECORD_MAX) must be at least 1, got 0")
	require.ErrorContains(t, run(t, "tui", "--dedup-record-max", "0"), "--dedup-record-max (DEDUP_RECORD_MAX) must be at least 1, got 0")
	require.ErrorContains(t, run(t, "tui", "--dedup-window", "1m"), "--dedup-window (DEDUP_WINDOW) must be at least 1h0m0s")
	require.ErrorContains(t, run(t, "run", "--dedup-window", "1m"), "--dedup-window (DEDUP_WINDOW) must be at least 1h0m0s")
	require.ErrorContains(t, run(t, "tui", "--refresh", "1ms"), "--refresh")
	require.ErrorContains(t, run(t, "run", "--ack-wait", "10ms"), "--ack-wait (CONSUMER_ACK_WAIT)")
	require.ErrorContains(t, run(t, "run", "--durable", "a b"), "--durable (CONSUMER_DURABLE)")
	require.ErrorContains(t, run(t, "run", "--max-payload-bytes", "-1"), "--max-payload-bytes (CONSUMER_MAX_PAYLOAD_BYTES)")
	require.ErrorContains(t, run(t, "run", "--broker", "carrier-pigeon"), `--broker (PGRELAY_BROKER) "carrier-pigeon": want kafka or nats`)
	t.Setenv("PGRELAY_BROKER", "smoke-signals")
	require.ErrorContains(t, run(t, "run"), `--broker (PGRELAY_BROKER) "smoke-signals"`)
	t.Setenv("PGRELAY_BROKER", "nats")
	t.Setenv("CONSUMER_ACK_WAIT", "soon")
	require.ErrorContains(t, run(t, "run"), `invalid CONSUMER_ACK_WAIT="soon"`)
	t.Setenv("CONSUMER_ACK_WAIT", "30s")
	require.ErrorContains(t, run(t, "run", "--batch-size", "20000"), "--batch-size (CONSUMER_BATCH_SIZE)")
	require.ErrorContains(t, run(t, "run", "--lease", "1s"), "--handler-timeout (CONSUMER_HANDLER_TIMEOUT) (10s) must be shorter than --lease (CONSUMER_LEASE) (1s)")
	require.ErrorContains(t, run(t, "run", "--log-level", "loud"), "--log-level / LOG_LEVEL")
	require.ErrorContains(t, run(t, "healthcheck", "--metrics-addr", ""), "--metrics-addr (METRICS_ADDR)")
	require.ErrorContains(t, run(t, "run", "--db-statement-timeout", "-1s"), "--db-statement-timeout (DB_STATEMENT_TIMEOUT)")
	require.ErrorContains(t, run(t, "run", "--db-idle-in-transaction-timeout", "5s"), "--db-idle-in-transaction-timeout (DB_IDLE_IN_TRANSACTION_TIMEOUT) must exceed the handler timeout 10s")
	require.ErrorContains(t, run(t, "run", "--db-tcp-keepalive", "10ms"), "--db-tcp-keepalive (DB_TCP_KEEPALIVE)")
	require.ErrorContains(t, run(t, "run", "--dup-rate-warn", "1.5"), "--dup-rate-warn (CONSUMER_DUP_RATE_WARN) 1.5 must be between 0 and 1")
	require.ErrorContains(t, run(t, "run", "--dup-rate-warn", "-0.1"), "--dup-rate-warn (CONSUMER_DUP_RATE_WARN)")
	t.Setenv("CONSUMER_DUP_RATE_WARN", "half")
	require.ErrorContains(t, run(t, "run"), `invalid CONSUMER_DUP_RATE_WARN="half"`)
	t.Setenv("CONSUMER_DUP_RATE_WARN", "2")
	require.ErrorContains(t, run(t, "run"), "--dup-rate-warn (CONSUMER_DUP_RATE_WARN) 2 must be between 0 and 1")
	t.Setenv("CONSUMER_DUP_RATE_WARN", "0.5")
	require.ErrorContains(t, run(t, "run", "--async-commit", "--pooler", "transaction"),
		"--async-commit (CONSUMER_ASYNC_COMMIT) needs a direct connection to PostgreSQL, got --pooler (DB_POOLER) transaction")
	require.ErrorContains(t, run(t, "run", "--async-commit", "--async-flush-after", "-1ms"), "--async-flush-after (CONSUMER_ASYNC_FLUSH_AFTER)")
	t.Setenv("DB_STATEMENT_TIMEOUT", "soon")
	require.ErrorContains(t, run(t, "run"), `invalid DB_STATEMENT_TIMEOUT="soon"`)
}

// TestSettingErrorsReadOnce: a bad setting gives one line per problem, each
// naming the flag once, with no line derived from the bad value (10 × a
// negative batch size) and no package prefix repeated ("consumer: inbox
// worker: inbox: ...").
func TestSettingErrorsReadOnce(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://127.0.0.1:1/none")
	err := run(t, "run", "--batch-size", "-1")
	require.EqualError(t, err, "consumer: --batch-size (CONSUMER_BATCH_SIZE) -1 must be between 1 and 10000")

	err = run(t, "run", "--workers", "-1", "--worker-batch-size", "-3")
	require.ErrorContains(t, err, "--workers (CONSUMER_WORKERS) must be between 1 and 1000, got -1")
	require.ErrorContains(t, err, "--worker-batch-size (CONSUMER_WORKER_BATCH_SIZE) must be between 1 and 10000, got -3")
	require.NotContains(t, err.Error(), "inbox worker")
	require.NotContains(t, err.Error(), "inbox: ")
	require.NotContains(t, err.Error(), "--batch-size (CONSUMER_BATCH_SIZE)", "the worker batch size is not the fetch batch size")
}

// TestEachSettingWrittenOnce: every flag's help ends with its environment
// variable, none is bound twice, and the sources spell each once.
func TestEachSettingWrittenOnce(t *testing.T) {
	clitest.CheckFlags(t, newRootCommand(), ".")
}
