package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/pgurl"
	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/internal/testnats"
)

// emptyDatabase creates a database with no pgrelay migration applied, dropped
// when the test ends, and returns its URL.
func emptyDatabase(t *testing.T) string {
	t.Helper()
	base := testdb.ServerURL(t)
	name := fmt.Sprintf("pgrelay_empty_%d", time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if c, err := pgx.Connect(ctx, base); err == nil {
			_, _ = c.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
			_ = c.Close(ctx)
		}
	})
	return pgurl.WithDatabase(base, name)
}

// runToExit runs a binary that must refuse to start: it has to exit non-zero
// within 30 seconds (not loop on warnings) and print want.
func runToExit(t *testing.T, bin string, env []string, args []string, want ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	require.NotErrorIs(t, ctx.Err(), context.DeadlineExceeded, "%s %v kept running instead of refusing to start:\n%s", filepath.Base(bin), args, tail(string(out), 4000))
	require.Error(t, err, "%s %v must exit non-zero:\n%s", filepath.Base(bin), args, tail(string(out), 4000))
	for _, w := range want {
		require.Contains(t, string(out), w, "%s %v: the message must say %q", filepath.Base(bin), args, w)
	}
	require.Less(t, strings.Count(string(out), "\n"), 20, "a refusal, not a loop of warnings:\n%s", tail(string(out), 4000))
}

// TestStartupHonesty: on a database without pgrelay's schema, or with part of
// it, both services refuse to start, naming the schema version and the
// command that fixes it; the consumer's ledger handler refuses a database
// without the example schema, naming the command that creates it; given an unreachable NATS URL, both refuse to start
// naming the URL and the cause. None of them loops on warnings or reports
// itself ready.
func TestStartupHonesty(t *testing.T) {
	t.Parallel()
	dir := bins(t)
	relay, consumer := filepath.Join(dir, "relay"), filepath.Join(dir, "consumer")
	natsURL := testnats.URL(t)
	stream, prefix := testnats.Stream(t, natsURL)
	relayEnv := func(db, nats string) []string {
		return []string{"DATABASE_URL=" + db, "NATS_URL=" + nats, "RELAY_STREAM=" + stream, "RELAY_SUBJECT_PREFIX=" + prefix,
			"METRICS_ADDR=", "ADMIN_ADDR=", "LOG_FORMAT=console"}
	}

	t.Run("unmigrated", func(t *testing.T) {
		t.Parallel()
		db := emptyDatabase(t)
		runToExit(t, relay, relayEnv(db, natsURL), []string{"run"},
			"not migrated", "this build needs version", "relay migrate up")
		runToExit(t, consumer, consumerEnv(db, natsURL, stream, prefix, "METRICS_ADDR="+freeAddr(t)), []string{"run"},
			"not migrated", "this build needs version", "consumer migrate up")
	})
	t.Run("no example schema", func(t *testing.T) {
		t.Parallel()
		db := emptyDatabase(t)
		migrate := func(args ...string) string {
			t.Helper()
			cmd := exec.Command(consumer, append([]string{"migrate", "up"}, args...)...)
			cmd.Env = append(os.Environ(), "DATABASE_URL="+db)
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "%s", out)
			return string(out)
		}
		tables := func() []string {
			t.Helper()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			conn, err := pgx.Connect(ctx, db)
			require.NoError(t, err)
			defer conn.Close(context.Background())
			rows, err := conn.Query(ctx, `SELECT tablename FROM pg_tables WHERE schemaname = 'public'
				AND (tablename LIKE 'ledger\_%' OR tablename LIKE 'shop\_%') ORDER BY 1`)
			require.NoError(t, err)
			names, err := pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(t, err)
			return names
		}
		migrate()
		require.Empty(t, tables(), "pgrelay's own migrations create no example tables")
		runToExit(t, consumer, consumerEnv(db, natsURL, stream, prefix, "METRICS_ADDR="+freeAddr(t)), []string{"run"},
			"the ledger handler needs the example schema", "ledger_orders, ledger_entries", "consumer migrate up --example-schema")
		// Another handler does not need the example schema: start-up gets past
		// that check and stops at the handler's own (a function not created).
		runToExit(t, consumer, consumerEnv(db, natsURL, stream, prefix, "METRICS_ADDR="+freeAddr(t),
			"CONSUMER_HANDLER=sql", "CONSUMER_SQL_FUNCTION=public.handle_event"), []string{"run"},
			"--sql-function (CONSUMER_SQL_FUNCTION)")
		out := migrate("--example-schema")
		require.Contains(t, out, "example schema:")
		require.Equal(t, []string{"ledger_entries", "ledger_orders", "shop_orders"}, tables())

		// status and down with --example-schema act on the example's set.
		run := func(args ...string) (string, error) {
			cmd := exec.Command(consumer, append([]string{"migrate"}, args...)...)
			cmd.Env = append(os.Environ(), "DATABASE_URL="+db)
			out, err := cmd.CombinedOutput()
			return string(out), err
		}
		out, err := run("status", "--example-schema")
		require.NoError(t, err, out)
		require.Regexp(t, `example/00020_demo_shop\.sql\s+applied`, out)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, db)
		require.NoError(t, err)
		defer conn.Close(context.Background())
		_, err = conn.Exec(ctx, `INSERT INTO shop_orders (order_id, customer_id, amount_cents, currency) VALUES ('o1', 'c1', 1, 'EUR')`)
		require.NoError(t, err)
		out, err = run("down", "--example-schema")
		require.Error(t, err, out)
		require.Contains(t, out, "00020_demo_shop would drop data")
		out, err = run("down", "--example-schema", "--force")
		require.NoError(t, err, out)
		require.Equal(t, []string{"ledger_entries", "ledger_orders"}, tables())
		out, err = run("status")
		require.NoError(t, err, out)
		require.NotContains(t, out, "pending", "pgrelay's own migrations are untouched")
	})
	t.Run("partly migrated", func(t *testing.T) {
		t.Parallel()
		db := testdb.NewURL(t)
		down := func() {
			t.Helper()
			cmd := exec.Command(consumer, "migrate", "down")
			cmd.Env = append(os.Environ(), "DATABASE_URL="+db)
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "%s", out)
		}
		// The latest migration rolled back: the consumer needs every one.
		down()
		runToExit(t, consumer, consumerEnv(db, natsURL, stream, prefix), []string{"run"}, "database schema is at version", "pending:", "consumer migrate up")
		// Then below the relay's minimum (relay/schema.go minSchemaTable,
		// 00118): it serves a database behind the latest down to that.
		const relayMinimum = 118
		for version(t, db) >= relayMinimum {
			down()
		}
		runToExit(t, relay, relayEnv(db, natsURL), []string{"run"}, "database schema is at version", "at least", "pending:", "relay migrate up")
	})
	t.Run("unreachable NATS", func(t *testing.T) {
		t.Parallel()
		db := testdb.NewURL(t)
		const bad = "nats://127.0.0.1:1"
		runToExit(t, relay, relayEnv(db, bad), []string{"run"}, bad, "--nats-url (NATS_URL)")
		runToExit(t, consumer, consumerEnv(db, bad, stream, prefix), []string{"run"}, bad, "--nats-url (NATS_URL)", "no servers available")
	})
}

// version is the database's pgrelay schema version (goose's table).
func version(t *testing.T, db string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, db)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var v int64
	require.NoError(t, conn.QueryRow(ctx, `SELECT max(version_id) FROM pgrelay.goose_db_version WHERE is_applied`).Scan(&v))
	return v
}
