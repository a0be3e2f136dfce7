package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// executeOut runs the relay's command line and returns what it printed.
func executeOut(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := newRootCommand()
	cmd.SetArgs(args)
	cmd.SilenceErrors = true
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

func storeDeadEvent(t *testing.T, pool *pgxpool.Pool, id string) {
	t.Helper()
	_, err := pgrelay.Receive(context.Background(), pool, []pgrelay.Incoming{{
		Message: pgrelay.Message{EventID: id, Topic: "orders", EventType: "OrderPaid"}, DeadReason: "malformed"}})
	require.NoError(t, err)
}

func deadCount(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM pgrelay.inbox WHERE status = 'dead'`).Scan(&n))
	return n
}

// TestOperatorCommandsNameTheDatabase: given the databases relay run serves
// (here --databases-file, and RELAY_DATABASES_FILE), an operator command
// that acts on one refuses to pick it when none is named, naming --database;
// named, its dry run, confirmation line and outcome start with the database's
// name, and only that database changes. stats shows each. One database needs
// no --database and prints as before.
func TestOperatorCommandsNameTheDatabase(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	t.Setenv("RELAY_DATABASES_FILE", "")
	orders, billing := testdb.New(t), testdb.New(t)
	storeDeadEvent(t, orders, "evt-orders")
	storeDeadEvent(t, billing, "evt-billing")
	file := filepath.Join(t.TempDir(), "dbs")
	require.NoError(t, os.WriteFile(file, []byte("orders="+orders.Config().ConnString()+"\nbilling="+billing.Config().ConnString()+"\n"), 0o600))

	const refusal = "2 databases are given (orders, billing): name the one to act on with --database"
	for _, args := range [][]string{
		{"dead", "purge", "--older-than", "0s", "--reason", "x"},
		{"dead", "requeue", "evt-billing", "--reason", "x"},
		{"outbox", "dead", "purge", "--older-than", "0s"},
		{"dead", "skip", "evt-billing", "--reason", "x"},
		{"gaps", "skip", "k", "--reason", "x"},
		{"wal", "accept-gap", "--reason", "x"},
		{"dead", "list"},
		{"migrate", "up"},
	} {
		_, err := executeOut(t, append(args, "--databases-file", file)...)
		require.ErrorContains(t, err, refusal, "%v", args)
	}
	require.Equal(t, 1, deadCount(t, orders))
	require.Equal(t, 1, deadCount(t, billing))

	out, err := executeOut(t, "dead", "purge", "--older-than", "0s", "--reason", "bad", "--actor", "ops", "--dry-run", "--databases-file", file, "--database", "billing")
	require.NoError(t, err)
	require.Contains(t, out, "database billing: dry run: would have purged 1 dead inbox event(s); nothing changed")
	m := regexp.MustCompile(`(?m)^database billing: to purge exactly these, run the same command without --dry-run and with --confirm (\S+) \(until `).FindStringSubmatch(out)
	require.NotNil(t, m, out)

	// The environment variable of relay run's file counts as the flag does.
	t.Setenv("RELAY_DATABASES_FILE", file)
	_, err = executeOut(t, "dead", "purge", "--older-than", "0s", "--reason", "bad", "--actor", "ops", "--confirm", m[1])
	require.ErrorContains(t, err, refusal)
	_, err = executeOut(t, "dead", "purge", "--older-than", "0s", "--reason", "bad", "--actor", "ops", "--confirm", m[1], "--database", "orders")
	require.ErrorContains(t, err, "stale", "a token reviewed in billing does nothing in orders")
	_, err = executeOut(t, "dead", "purge", "--older-than", "0s", "--database", "shipping")
	require.ErrorContains(t, err, "--database shipping: no such database (given: orders, billing)")
	out, err = executeOut(t, "dead", "purge", "--older-than", "0s", "--reason", "bad", "--actor", "ops", "--confirm", m[1], "--database", "billing")
	require.NoError(t, err)
	require.Contains(t, out, "database billing: purged 1 dead inbox event(s)")
	require.Equal(t, 1, deadCount(t, orders))
	require.Zero(t, deadCount(t, billing))

	out, err = executeOut(t, "migrate", "status", "--database", "orders")
	require.NoError(t, err)
	require.Regexp(t, `(?m)^database orders: \d+ `, out)

	out, err = executeOut(t, "stats")
	require.NoError(t, err)
	require.Regexp(t, `(?s)^== orders\n.*\n\n== billing\n`, out)

	// One database: no --database needed, nothing prefixed.
	t.Setenv("RELAY_DATABASES_FILE", "")
	out, err = executeOut(t, "dead", "purge", "--older-than", "0s", "--reason", "bad", "--database-url", orders.Config().ConnString())
	require.NoError(t, err)
	require.Contains(t, out, "\npurged 1 dead inbox event(s)"[1:])
	require.NotContains(t, out, "database ")
}
