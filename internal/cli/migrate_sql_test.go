package cli_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/cli"
	"github.com/pgrelay/pgrelay/internal/pgurl"
	"github.com/pgrelay/pgrelay/migrations"
)

// TestMigrateSQL: `migrate sql` prints the chosen migrations without a
// database, --adopt only the adoption statement, and refuses --adopt with a
// range.
func TestMigrateSQL(t *testing.T) {
	t.Parallel()
	run := func(args ...string) (string, error) {
		var url string // no database needed
		cmd := cli.MigrateCommand(pgurl.One(&url))
		var out bytes.Buffer
		cmd.SetArgs(append([]string{"sql"}, args...))
		cmd.SetOut(&out)
		cmd.SilenceUsage, cmd.SilenceErrors = true, true
		err := cmd.ExecuteContext(context.Background())
		return out.String(), err
	}
	out, err := run("--from", "86", "--to", "90")
	require.NoError(t, err)
	require.Contains(t, out, "-- 00086_inbox_ordered.sql (up)")
	require.Contains(t, out, "-- 00090_outbox_producer_path.sql (up)")
	require.NotContains(t, out, "-- 00085_outbox_key_seqs.sql (up)")
	require.Contains(t, out, "INSERT INTO pgrelay.goose_db_version (version_id, is_applied) VALUES (90, true);")

	out, err = run("--down", "--from", "100")
	require.NoError(t, err)
	require.Contains(t, out, "-- 00100_pgrelay_schema.sql (down)")
	require.Contains(t, out, "DELETE FROM pgrelay.goose_db_version WHERE version_id = 100;")

	out, err = run("--adopt")
	require.NoError(t, err)
	require.Equal(t, migrations.AdoptSQL+";\n", out)

	_, err = run("--adopt", "--down")
	require.ErrorContains(t, err, "--adopt prints the adoption statement only")
	_, err = run("--from", "90", "--to", "3")
	require.ErrorContains(t, err, "not a range")
}
