package migrations_test

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	ledgermigrations "github.com/pgrelay/pgrelay/internal/ledger/migrations"
	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/migrations"
)

// emptyDatabase creates a database without any migration, dropped at the
// end, and returns a pool and a *sql.DB over it.
func emptyDatabase(t *testing.T) (*pgxpool.Pool, *sql.DB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, testdb.EmptyURL(t))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	sqlDB := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = sqlDB.Close() })
	return pool, sqlDB
}

func exampleTables(t *testing.T, ctx context.Context, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT tablename FROM pg_tables WHERE schemaname = 'public'
		AND (tablename LIKE 'ledger\_%' OR tablename LIKE 'shop\_%') ORDER BY 1`)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return names
}

func appliedVersions(t *testing.T, ctx context.Context, pool *pgxpool.Pool, table string) []int64 {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT version_id FROM `+pgx.Identifier(strings.Split(table, ".")).Sanitize()+` WHERE version_id > 0 AND is_applied ORDER BY 1`)
	require.NoError(t, err)
	v, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	return v
}

// TestFreshInstall: pgrelay's migrations on an empty database create no
// example table, and the ledger check says how to create them; the example
// schema then creates them, recorded in its own version table, and both
// checks pass.
func TestFreshInstall(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pool, sqlDB := emptyDatabase(t)

	require.NoError(t, migrations.Up(ctx, sqlDB))
	require.NoError(t, migrations.Check(ctx, sqlDB))
	require.Empty(t, exampleTables(t, ctx, pool), "pgrelay's migrations create no example table")
	var missing *ledgermigrations.MissingError
	require.ErrorAs(t, ledgermigrations.Check(ctx, pool), &missing)
	require.Equal(t, []string{"ledger_orders", "ledger_entries"}, missing.Tables)
	require.ErrorContains(t, missing, "consumer migrate up --example-schema")

	require.NoError(t, ledgermigrations.Up(ctx, sqlDB))
	require.Equal(t, []string{"ledger_entries", "ledger_orders", "shop_orders"}, exampleTables(t, ctx, pool))
	require.NoError(t, ledgermigrations.Check(ctx, pool))
	require.NoError(t, migrations.Check(ctx, sqlDB))
	require.Equal(t, []int64{2, 20}, appliedVersions(t, ctx, pool, ledgermigrations.TableName))
	for _, v := range appliedVersions(t, ctx, pool, migrations.TableName) {
		require.NotContains(t, []int64{2, 20}, v, "pgrelay's version table records no example version")
	}
	// A second run applies nothing.
	require.NoError(t, migrations.Up(ctx, sqlDB))
	require.NoError(t, ledgermigrations.Up(ctx, sqlDB))
}

// lastCombinedVersion is pgrelay's newest migration from the time the
// example schema was part of pgrelay's migrations.
const lastCombinedVersion = 45

// oldSet is pgrelay's migration set as it was while the example schema was
// part of it: pgrelay's files up to lastCombinedVersion (as released, with
// their objects in public: migrations/testdata/public-v90) plus the ledger
// (version 2) and the demo shop (version 20) as they were released
// (testdata/combined, without IF NOT EXISTS), all recorded in goose's one
// version table, public.goose_db_version.
func oldSet(t *testing.T) fs.FS {
	t.Helper()
	old := fstest.MapFS{}
	for _, set := range []fs.FS{os.DirFS("../../../migrations/testdata/public-v90"), os.DirFS("testdata/combined")} {
		names, err := fs.Glob(set, "*.sql")
		require.NoError(t, err)
		for _, n := range names {
			var v int64
			_, err := fmt.Sscanf(n, "%05d_", &v)
			require.NoError(t, err, n)
			if v > lastCombinedVersion {
				continue
			}
			b, err := fs.ReadFile(set, n)
			require.NoError(t, err)
			old[n] = &fstest.MapFile{Data: b}
		}
	}
	require.Contains(t, old, "00002_ledger.sql")
	require.Contains(t, old, "00020_demo_shop.sql")
	return old
}

// TestUpgradeFromCombinedSet: a database migrated when the ledger and the
// shop were pgrelay's versions 2 and 20, holding ledger data, keeps working:
// pgrelay's migrations neither fail on the versions they no longer hold nor
// demand them, the ledger check passes on the tables as they are, the
// example schema adopts them without touching their rows, and pgrelay's
// migrations still roll back (all the way) and forth.
func TestUpgradeFromCombinedSet(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	pool, sqlDB := emptyDatabase(t)

	old, err := goose.NewProvider(goose.DialectPostgres, sqlDB, oldSet(t))
	require.NoError(t, err)
	_, err = old.Up(ctx)
	require.NoError(t, err)
	oldVersions := appliedVersions(t, ctx, pool, goose.DefaultTablename)
	require.Contains(t, oldVersions, int64(2))
	require.Contains(t, oldVersions, int64(20))
	require.Equal(t, int64(lastCombinedVersion), oldVersions[len(oldVersions)-1])
	_, err = pool.Exec(ctx, `INSERT INTO ledger_orders (order_id, customer_id, amount_cents, currency, event_id) VALUES ('o1', 'c1', 1250, 'EUR', 'e1');
		INSERT INTO ledger_entries (event_id, order_id, customer_id, amount_cents, currency) VALUES ('e2', 'o1', 'c1', 1250, 'EUR');
		INSERT INTO shop_orders (order_id, customer_id, amount_cents, currency) VALUES ('o1', 'c1', 1250, 'EUR')`)
	require.NoError(t, err)

	// The new build on the old database.
	require.NoError(t, migrations.Up(ctx, sqlDB))
	require.NoError(t, migrations.Check(ctx, sqlDB))
	require.NoError(t, ledgermigrations.Check(ctx, pool))
	p, err := migrations.NewProvider(sqlDB)
	require.NoError(t, err)
	sts, err := p.Status(ctx)
	require.NoError(t, err)
	for _, s := range sts {
		require.Equal(t, goose.StateApplied, s.State, s.Source.Path)
	}
	_, err = p.Down(ctx)
	require.NoError(t, err)
	require.Error(t, migrations.Check(ctx, sqlDB))
	_, err = p.Up(ctx)
	require.NoError(t, err)
	require.NoError(t, migrations.Check(ctx, sqlDB))

	require.NoError(t, ledgermigrations.Up(ctx, sqlDB))
	require.Equal(t, []int64{2, 20}, appliedVersions(t, ctx, pool, ledgermigrations.TableName))
	for _, v := range appliedVersions(t, ctx, pool, migrations.TableName) {
		require.NotContains(t, []int64{2, 20}, v, "pgrelay's version table never records the example's versions")
	}
	// The shared table of the old installation is left as it was: its rows
	// may be the application's.
	require.Equal(t, oldVersions, appliedVersions(t, ctx, pool, goose.DefaultTablename))
	dataStays := func() {
		t.Helper()
		var orders, entries, shop int
		require.NoError(t, pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM ledger_orders), (SELECT count(*) FROM ledger_entries), (SELECT count(*) FROM shop_orders)`).Scan(&orders, &entries, &shop))
		require.Equal(t, []int{1, 1, 1}, []int{orders, entries, shop}, "the ledger data stays")
		require.NoError(t, ledgermigrations.Check(ctx, pool))
	}
	dataStays()

	// pgrelay's migrations roll all the way back and up again around the
	// example's tables.
	_, err = p.DownTo(ctx, 0)
	require.NoError(t, err)
	dataStays()
	require.NoError(t, migrations.Up(ctx, sqlDB))
	require.NoError(t, migrations.Check(ctx, sqlDB))
	dataStays()
}

// TestDownRefusesToDropData: rolling back the example schema refuses while
// its tables hold rows, naming the override; with pgrelay.force_down=on it
// goes ahead.
func TestDownRefusesToDropData(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pool := testdb.New(t)
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()
	p, err := ledgermigrations.NewProvider(sqlDB)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO shop_orders (order_id, customer_id, amount_cents, currency) VALUES ('o1', 'c1', 100, 'EUR');
		INSERT INTO ledger_orders (order_id, customer_id, amount_cents, currency, event_id) VALUES ('o1', 'c1', 100, 'EUR', 'e2')`)
	require.NoError(t, err)

	_, err = p.Down(ctx)
	require.ErrorContains(t, err, "migrate down: 00020_demo_shop would drop data")
	require.ErrorContains(t, err, "pgrelay.force_down=on")
	_, err = pool.Exec(ctx, `DELETE FROM shop_orders`)
	require.NoError(t, err)
	_, err = p.Down(ctx)
	require.NoError(t, err)
	_, err = p.Down(ctx)
	require.ErrorContains(t, err, "migrate down: 00002_ledger would drop data")

	cfg := pool.Config().Copy()
	cfg.ConnConfig.RuntimeParams["pgrelay.force_down"] = "on"
	forced, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer forced.Close()
	forcedDB := stdlib.OpenDBFromPool(forced)
	defer forcedDB.Close()
	fp, err := ledgermigrations.NewProvider(forcedDB)
	require.NoError(t, err)
	_, err = fp.Down(ctx)
	require.NoError(t, err)
	require.Empty(t, exampleTables(t, ctx, forced))
	require.NoError(t, migrations.Check(ctx, forcedDB), "pgrelay's schema is untouched")
}
