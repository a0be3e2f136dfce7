package migrations_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/migrations"
)

// TestWriteSQL: the printed up SQL, run by another tool (here: as one
// script), builds the same objects as the embedded migrations and records
// the versions so that the services' check passes; the printed down SQL of
// a range rolls exactly those versions back; ranges are checked.
func TestWriteSQL(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	url := testdb.EmptyURL(t)
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	defer pool.Close()
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()

	var up bytes.Buffer
	require.NoError(t, migrations.WriteSQL(&up, migrations.SQLOptions{}))
	require.Contains(t, up.String(), "-- 00001_inbox.sql (up)")
	require.NotContains(t, up.String(), "+goose Up")
	_, err = pool.Exec(ctx, up.String())
	require.NoError(t, err)
	require.NoError(t, migrations.Check(ctx, sqlDB), "the versions are recorded as goose records them")
	fresh := testdb.New(t)
	require.Equal(t, objects(t, ctx, fresh, "pgrelay"), objects(t, ctx, pool, "pgrelay"))

	// goose itself takes over from there.
	p, err := migrations.NewProvider(sqlDB)
	require.NoError(t, err)
	sts, err := p.Status(ctx)
	require.NoError(t, err)
	for _, s := range sts {
		require.Equal(t, goose.StateApplied, s.State, s.Source.Path)
	}

	var down bytes.Buffer
	require.NoError(t, migrations.WriteSQL(&down, migrations.SQLOptions{Down: true, From: 86}))
	require.Less(t, strings.Index(down.String(), "00100_pgrelay_schema.sql (down)"), strings.Index(down.String(), "00086_inbox_ordered.sql (down)"), "newest first")
	require.NotContains(t, down.String(), "-- 00085_outbox_key_seqs.sql (down)")
	_, err = pool.Exec(ctx, down.String())
	require.NoError(t, err)
	var se *migrations.SchemaError
	require.ErrorAs(t, migrations.Check(ctx, sqlDB), &se)
	require.EqualValues(t, 85, se.Current)
	var exists bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT to_regclass('pgrelay.inbox_key_state') IS NOT NULL`).Scan(&exists))
	require.False(t, exists, "86 rolled back")

	var one bytes.Buffer
	require.NoError(t, migrations.WriteSQL(&one, migrations.SQLOptions{From: 86, To: 86}))
	require.Contains(t, one.String(), "00086_inbox_ordered.sql (up)")
	require.NotContains(t, one.String(), "-- 00090_outbox_producer_path.sql (up)")
	require.Error(t, migrations.WriteSQL(&one, migrations.SQLOptions{From: 90, To: 86}))
	require.ErrorContains(t, migrations.WriteSQL(&one, migrations.SQLOptions{From: 100000, To: 100001}), "no migration between versions 100000 and 100001")
}
