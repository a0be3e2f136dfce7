package migrations_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/migrations"
)

// documented is the goose CLI's command as docs/schema.md gives it.
const documented = `goose -dir migrations -table pgrelay.goose_db_version postgres "$DATABASE_URL" up`

// TestGooseCLIWithoutTableRefused: the goose CLI run as the release before
// pgrelay had its own version table documented it (no -table: goose's
// goose_db_version) is refused with the documented command, on a new
// database before anything is installed, and on an installation of that
// release before anything moves; the documented command then works.
func TestGooseCLIWithoutTableRefused(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, existing := range []bool{false, true} {
		url := testdb.EmptyURL(t)
		pool, err := pgxpool.New(ctx, url)
		require.NoError(t, err)
		defer pool.Close()
		sqlDB := stdlib.OpenDBFromPool(pool)
		defer sqlDB.Close()
		if existing {
			old, err := goose.NewProvider(goose.DialectPostgres, sqlDB, publicEra(t))
			require.NoError(t, err)
			_, err = old.Up(ctx)
			require.NoError(t, err)
		}
		latest := func() (v int64) {
			t.Helper()
			require.NoError(t, pool.QueryRow(ctx, `SELECT coalesce(max(version_id), 0) FROM public.goose_db_version`).Scan(&v))
			return v
		}
		want := int64(0)
		if existing {
			want = latest()
		}

		oldCLI, err := goose.NewProvider(goose.DialectPostgres, sqlDB, migrations.FS)
		require.NoError(t, err)
		_, err = oldCLI.Up(ctx)
		require.ErrorContains(t, err, documented)
		require.Equal(t, want, latest(), "no version recorded")
		var inPgrelay, inPublic bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT to_regclass('pgrelay.inbox') IS NOT NULL, to_regclass('public.inbox') IS NOT NULL`).Scan(&inPgrelay, &inPublic))
		require.False(t, inPgrelay, "nothing installed or moved into pgrelay")
		require.Equal(t, existing, inPublic, "an older installation stays where it was")

		// The documented way: the schema, the adoption of an older
		// installation's versions, then goose with -table.
		_, err = pool.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS pgrelay`)
		require.NoError(t, err)
		if existing {
			_, err = pool.Exec(ctx, migrations.AdoptSQL)
			require.NoError(t, err)
		}
		cli, err := goose.NewProvider(goose.DialectPostgres, sqlDB, migrations.FS, goose.WithTableName(migrations.TableName))
		require.NoError(t, err)
		_, err = cli.Up(ctx)
		require.NoError(t, err)
		allApplied(t, ctx, sqlDB)

		// goose pointed at another table again: version 1 is not installed twice.
		_, err = oldCLI.Up(ctx)
		if !existing {
			require.ErrorContains(t, err, "pgrelay is already installed (version 1 is recorded in pgrelay.goose_db_version)")
		}
	}
}
