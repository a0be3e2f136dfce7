package cli

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/pgurl"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// TestMigrateDownRefusalSaysWhatAndWhy: a rollback a migration refuses (it
// would drop data) fails with a message naming the refused migration, why,
// that nothing was rolled back and how to override it, not goose's
// "partial migration error" with the SQL statement's text.
func TestMigrateDownRefusalSaysWhatAndWhy(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Below version 100 the functions' bodies name pgrelay's objects
	// without a schema.
	cc, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	cc.RuntimeParams["search_path"] = "pgrelay, public"
	conn, err := pgx.ConnectConfig(ctx, cc)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	version := func() int64 {
		var v int64
		require.NoError(t, conn.QueryRow(ctx, `SELECT max(version_id) FROM pgrelay.goose_db_version WHERE is_applied`).Scan(&v))
		return v
	}
	migrate := func(args ...string) (string, error) {
		cmd := MigrateCommand(pgurl.One(&url))
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(args)
		cmd.SilenceUsage = true
		err := cmd.ExecuteContext(ctx)
		return out.String(), err
	}
	// Down to 00085, whose rollback refuses while the outbox holds key
	// sequences; --force for the later ones, whatever they hold.
	for version() > 85 {
		out, err := migrate("down", "--force")
		require.NoError(t, err, out)
	}
	require.EqualValues(t, 85, version())
	_, err = conn.Exec(ctx, `INSERT INTO pgrelay.outbox (topic, key, payload) VALUES ('orders', 'order-1', '\x')`)
	require.NoError(t, err)

	_, err = migrate("down")
	require.Error(t, err)
	msg := err.Error()
	t.Log(msg)
	require.NotContains(t, msg, "partial migration error")
	require.NotContains(t, msg, "RAISE EXCEPTION", "not the statement's text")
	require.Contains(t, msg, "migrate down refused")
	require.Contains(t, msg, "00085_outbox_key_seqs")
	require.Contains(t, msg, "would drop data")
	require.Contains(t, msg, "nothing was changed")
	require.Contains(t, msg, "--force")
	require.EqualValues(t, 85, version(), "a refused rollback changes nothing")

	out, err := migrate("down", "--force")
	require.NoError(t, err, out)
	require.EqualValues(t, 80, version())
}

// TestMigrateUpFailureNamesTheMigration: a migration that fails on the way
// up is named, with the ones applied before it, instead of goose's "partial
// migration error".
func TestMigrateUpFailureNamesTheMigration(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	migrate := func(args ...string) error {
		cmd := MigrateCommand(pgurl.One(&url))
		cmd.SetOut(&bytes.Buffer{})
		cmd.SetErr(&bytes.Buffer{})
		cmd.SetArgs(args)
		cmd.SilenceUsage = true
		return cmd.ExecuteContext(ctx)
	}
	// Back to 00086, then make 00095 fail: the constraint it adds exists
	// already.
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	for {
		var v int64
		require.NoError(t, conn.QueryRow(ctx, `SELECT max(version_id) FROM pgrelay.goose_db_version WHERE is_applied`).Scan(&v))
		if v <= 86 {
			break
		}
		require.NoError(t, migrate("down", "--force"))
	}
	_, err = conn.Exec(ctx, `ALTER TABLE pgrelay.outbox ADD CONSTRAINT outbox_topic_valid CHECK (true)`)
	require.NoError(t, err)
	err = migrate("up")
	require.Error(t, err)
	t.Log(err)
	require.NotContains(t, err.Error(), "partial migration error")
	require.Contains(t, err.Error(), "migrate up: 00095_outbox_topic_check.sql failed after ")
	require.Contains(t, err.Error(), "00090_outbox_producer_path.sql", "the migrations applied before it")
	require.Contains(t, err.Error(), "its own changes were undone")
	require.Contains(t, err.Error(), `"outbox_topic_valid"`)
}
