package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/cli/clitest"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// TestMain runs the relay's main when re-executed by TestSIGTERMReleasesLeases.
func TestMain(m *testing.M) {
	if args := os.Getenv("RELAY_MAIN_ARGS"); args != "" {
		os.Args = append([]string{"relay"}, strings.Split(args, " ")...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func execute(ctx context.Context, args ...string) error {
	cmd := newRootCommand()
	cmd.SetArgs(args)
	cmd.SilenceErrors = true
	return cmd.ExecuteContext(ctx)
}

// TestSettingsErrorsNameTheSetting: bad configuration fails at start-up with
// an error naming the flag and environment variable to fix.
func TestSettingsErrorsNameTheSetting(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	ctx := context.Background()
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"run"}, "--database-url (DATABASE_URL) or --databases-file (RELAY_DATABASES_FILE) is required"},
		{[]string{"run", "--database-url", "postgres://x", "--batch-size", "-1"}, "--batch-size (RELAY_BATCH_SIZE)"},
		{[]string{"run", "--database-url", "postgres://x", "--lease", "5s", "--heartbeat", "10s"}, "--heartbeat (RELAY_HEARTBEAT)"},
		{[]string{"run", "--database-url", "postgres://x", "--retention-batch", "-1"}, "--retention-batch (RELAY_RETENTION_BATCH)"},
		{[]string{"run", "--database-url", "postgres://x", "--ack-timeout", "-1s"}, "--ack-timeout (RELAY_ACK_TIMEOUT)"},
		{[]string{"run", "--database-url", "postgres://x", "--stream", "a.b"}, "--stream (RELAY_STREAM)"},
		{[]string{"run", "--database-url", "postgres://x", "--stream-replicas", "7"}, "--stream-replicas (RELAY_STREAM_REPLICAS) must be 1 to 5"},
		{[]string{"run", "--database-url", "postgres://x", "--broker", "carrier-pigeon"}, `--broker (PGRELAY_BROKER) "carrier-pigeon": want kafka or nats`},
		{[]string{"run", "--database-url", "postgres://x", "--log-level", "loud"}, "--log-level"},
		{[]string{"run", "--database-url", "::not a url::"}, "--database-url (DATABASE_URL)"},
		{[]string{"run", "--database-url", "postgres://x", "--db-statement-timeout", "1us"}, "--db-statement-timeout (DB_STATEMENT_TIMEOUT)"},
		{[]string{"run", "--database-url", "postgres://x", "--db-idle-in-transaction-timeout", "1ns"}, "--db-idle-in-transaction-timeout (DB_IDLE_IN_TRANSACTION_TIMEOUT)"},
		{[]string{"run", "--database-url", "postgres://x", "--db-tcp-keepalive", "-5s"}, "--db-tcp-keepalive (DB_TCP_KEEPALIVE)"},
		{[]string{"run", "--database-url", "postgres://x", "--standby-names", "a,,b"}, "--standby-names (RELAY_STANDBY_NAMES) holds an empty name"},
		{[]string{"run", "--database-url", "postgres://x", "--standby-names", "a", "--capture", "wal"}, "--standby-names (RELAY_STANDBY_NAMES) applies to table capture only"},
		{[]string{"run", "--database-url", "postgres://postgres@127.0.0.1:1/x?connect_timeout=2"}, "--database-url (DATABASE_URL): cannot reach PostgreSQL"},
	}
	for _, c := range cases {
		err := execute(ctx, c.args...)
		require.ErrorContains(t, err, c.want, "%v", c.args)
	}
	t.Setenv("PGRELAY_BROKER", "smoke-signals")
	require.ErrorContains(t, execute(ctx, "run", "--database-url", "postgres://x"), `--broker (PGRELAY_BROKER) "smoke-signals"`)
	t.Setenv("PGRELAY_BROKER", "nats")
	t.Setenv("RELAY_BATCH_SIZE", "lots")
	require.ErrorContains(t, execute(ctx, "run", "--database-url", "postgres://x"), `invalid RELAY_BATCH_SIZE="lots"`)
}

// TestRunWithEmbeddedNATS: with no NATS URL the relay starts its own NATS
// JetStream server, publishes, and on shutdown releases its leases.
func TestRunWithEmbeddedNATS(t *testing.T) {
	pool := testdb.New(t)
	url := pool.Config().ConnString()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- execute(ctx, "run", "--database-url", url, "--nats-url", "", "--embedded-nats-dir", t.TempDir(),
			"--embedded-nats-listen", "127.0.0.1:0", "--lease", "2s", "--poll-interval", "100ms", "--log-level", "warn",
			"--metrics-addr", "127.0.0.1:0", "--admin-addr", "")
	}()
	_, err := pool.Exec(context.Background(), `INSERT INTO pgrelay.outbox (topic, key, payload) VALUES ('orders', 'k', 'x')`)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var n int
		_ = pool.QueryRow(context.Background(), `SELECT count(*) FROM pgrelay.outbox WHERE status = 'published'`).Scan(&n)
		return n == 1
	}, 20*time.Second, 20*time.Millisecond)
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("relay did not stop")
	}
	var owned int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM pgrelay.relay_partitions WHERE owner IS NOT NULL`).Scan(&owned))
	require.Zero(t, owned, "a stopped relay releases its leases")
}

// TestSIGTERMReleasesLeases runs the relay as a real process and stops it with
// SIGTERM: it exits 0 having released every lease. Its start checked the
// migrations once: goose's version table was read once (its scans, counted
// by PostgreSQL in a database cloned just before, are flushed when the
// relay's sessions end).
func TestSIGTERMReleasesLeases(t *testing.T) {
	pool := testdb.New(t)
	url := pool.Config().ConnString()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "RELAY_MAIN_ARGS=run --nats-url= --embedded-nats-listen 127.0.0.1:0 --embedded-nats-dir "+t.TempDir()+" --log-format console",
		"DATABASE_URL="+url, "METRICS_ADDR=127.0.0.1:0", "ADMIN_ADDR=")
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			t.Log(sc.Text())
		}
	}()
	_, err = pool.Exec(context.Background(), `INSERT INTO pgrelay.outbox (topic, key, payload) VALUES ('orders', 'k', 'x')`)
	require.NoError(t, err)
	count := func(q string) int {
		var n int
		_ = pool.QueryRow(context.Background(), q).Scan(&n)
		return n
	}
	require.Eventually(t, func() bool { return count(`SELECT count(*) FROM pgrelay.outbox WHERE status = 'published'`) == 1 }, 20*time.Second, 20*time.Millisecond)
	require.Equal(t, 16, count(`SELECT count(*) FROM pgrelay.relay_partitions WHERE owner IS NOT NULL`))
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait(), "a SIGTERM is a clean exit")
	require.Zero(t, count(`SELECT count(*) FROM pgrelay.relay_partitions WHERE owner IS NOT NULL`), "leases released")
	require.Zero(t, count(`SELECT count(*) FROM pgrelay.relay_nodes`))
	const scans = `SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0) FROM pg_stat_user_tables WHERE schemaname = 'pgrelay' AND relname = 'goose_db_version'`
	require.Eventually(t, func() bool { return count(scans) > 0 }, 10*time.Second, 50*time.Millisecond)
	time.Sleep(time.Second) // the last sessions' statistics
	require.Equal(t, 1, count(scans), "one start, one migrations check")
}

// TestSettingErrorsCarryNoPackagePrefix: main prefixes "relay:" once; a
// setting error must not carry the relay package's own prefix as well
// ("relay: relay: --batch-size ...").
func TestSettingErrorsCarryNoPackagePrefix(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	err := execute(context.Background(), "run", "--database-url", "postgres://x", "--batch-size", "-1")
	require.EqualError(t, err, "--batch-size (RELAY_BATCH_SIZE) must be between 1 and 10000, got -1")
}

// TestEachSettingWrittenOnce: every flag's help ends with its environment
// variable, none is bound twice, and the sources spell each once.
func TestEachSettingWrittenOnce(t *testing.T) {
	clitest.CheckFlags(t, newRootCommand(), ".")
}
