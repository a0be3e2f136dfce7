package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// TestOperatorCommandsOnTheOneDatabase: the consumer serves one database:
// its operator commands act on it without --database and print no database
// name; a --database naming another is refused rather than ignored.
func TestOperatorCommandsOnTheOneDatabase(t *testing.T) {
	pool := testdb.New(t)
	url := pool.Config().ConnString()
	t.Setenv("DATABASE_URL", url)
	_, err := pgrelay.Receive(context.Background(), pool, []pgrelay.Incoming{{
		Message: pgrelay.Message{EventID: "evt-1", Topic: "orders"}, DeadReason: "malformed"}})
	require.NoError(t, err)
	execute := func(args ...string) (string, error) {
		cmd := newRootCommand()
		cmd.SetArgs(args)
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		err := cmd.ExecuteContext(context.Background())
		return out.String(), err
	}
	out, err := execute("dead", "purge", "--older-than", "0s", "--dry-run")
	require.NoError(t, err)
	require.Contains(t, out, "dry run: would have purged 1 dead inbox event(s)")
	require.NotContains(t, out, "database ")

	db := pool.Config().ConnConfig.Database
	_, err = execute("dead", "purge", "--older-than", "0s", "--database", "elsewhere")
	require.ErrorContains(t, err, "--database elsewhere: no such database (given: "+db+")")
	out, err = execute("dead", "purge", "--older-than", "0s", "--reason", "bad", "--database", db)
	require.NoError(t, err)
	require.Contains(t, out, "purged 1 dead inbox event(s)")
	require.NotContains(t, out, "database ")
}
