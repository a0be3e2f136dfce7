package migrations_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/migrations"
)

// appMigrations is a service's own goose migrations, recorded in goose's
// default table public.goose_db_version: versions 1, 2, 3 and 20, the last
// one deleted by pgrelay's 00065 as it was released, and tables named like
// pgrelay's.
func appMigrations(extra bool) fs.FS {
	m := fstest.MapFS{
		"00001_app_outbox.sql": {Data: []byte(`-- +goose Up
CREATE TABLE public.outbox (id serial PRIMARY KEY, body text NOT NULL);
-- +goose Down
DROP TABLE public.outbox;
`)},
		"00002_app_inbox.sql": {Data: []byte(`-- +goose Up
CREATE TABLE public.inbox (id serial PRIMARY KEY, body text NOT NULL);
-- +goose Down
DROP TABLE public.inbox;
`)},
		"00003_app_orders.sql": {Data: []byte(`-- +goose Up
CREATE TABLE orders (id serial PRIMARY KEY);
INSERT INTO public.outbox (body) VALUES ('the application''s own');
-- +goose Down
DROP TABLE orders;
`)},
		"00020_app_invoices.sql": {Data: []byte(`-- +goose Up
CREATE TABLE invoices (id serial PRIMARY KEY);
-- +goose Down
DROP TABLE invoices;
`)},
	}
	if extra {
		m["00021_app_refunds.sql"] = &fstest.MapFile{Data: []byte(`-- +goose Up
CREATE TABLE refunds (id serial PRIMARY KEY);
-- +goose Down
DROP TABLE refunds;
`)}
	}
	return m
}

// versionRows returns a version table's rows as "version:applied", in id order.
func versionRows(t *testing.T, ctx context.Context, pool *pgxpool.Pool, table string) []string {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT version_id || ':' || is_applied FROM `+table+` ORDER BY id`)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return out
}

// allApplied checks that every embedded migration is applied, in pgrelay's
// own version table.
func allApplied(t *testing.T, ctx context.Context, sqlDB *sql.DB) {
	t.Helper()
	p, err := migrations.NewProvider(sqlDB)
	require.NoError(t, err)
	sts, err := p.Status(ctx)
	require.NoError(t, err)
	for _, s := range sts {
		require.Equal(t, goose.StateApplied, s.State, s.Source.Path)
	}
	require.NoError(t, migrations.Check(ctx, sqlDB))
}

// TestApplicationVersionTableUntouched (issue 24): a service with its own
// goose migrations 1, 2, 3 and 20 and its own outbox and inbox tables in the
// same database, migrated before and after pgrelay, keeps its tables, rows
// and version rows, and every pgrelay migration applies.
func TestApplicationVersionTableUntouched(t *testing.T) {
	t.Parallel()
	for _, appFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("application first %v", appFirst), func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			url := testdb.EmptyURL(t)
			pool, err := pgxpool.New(ctx, url)
			require.NoError(t, err)
			defer pool.Close()
			sqlDB := stdlib.OpenDBFromPool(pool)
			defer sqlDB.Close()
			appUp := func(extra bool) {
				t.Helper()
				app, err := goose.NewProvider(goose.DialectPostgres, sqlDB, appMigrations(extra))
				require.NoError(t, err)
				_, err = app.Up(ctx)
				require.NoError(t, err)
			}
			if appFirst {
				appUp(false)
			}
			require.NoError(t, migrations.Up(ctx, sqlDB))
			if !appFirst {
				appUp(false)
			}
			appRows := versionRows(t, ctx, pool, "public.goose_db_version")
			require.Equal(t, []string{"0:true", "1:true", "2:true", "3:true", "20:true"}, appRows)
			allApplied(t, ctx, sqlDB)

			// The service migrates again, then pgrelay: nothing of either is
			// taken for the other's.
			appUp(true)
			require.NoError(t, migrations.Up(ctx, sqlDB))
			require.Equal(t, append(appRows, "21:true"), versionRows(t, ctx, pool, "public.goose_db_version"))
			allApplied(t, ctx, sqlDB)
			for _, v := range versionRows(t, ctx, pool, migrations.TableName) {
				require.NotContains(t, []string{"2:true", "20:true", "21:true"}, v, "pgrelay records only its own versions")
			}

			var tables []string
			rows, err := pool.Query(ctx, `SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1`)
			require.NoError(t, err)
			tables, err = pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(t, err)
			require.Equal(t, []string{"goose_db_version", "inbox", "invoices", "orders", "outbox", "refunds"}, tables,
				"public holds the service's tables only")
			var body string
			require.NoError(t, pool.QueryRow(ctx, `SELECT string_agg(body, ',') FROM public.outbox`).Scan(&body))
			require.Equal(t, "the application's own", body)
			var cols int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM information_schema.columns WHERE table_schema = 'public' AND table_name = 'outbox'`).Scan(&cols))
			require.Equal(t, 2, cols, "the service's outbox is as it made it")

			// pgrelay works beside them, whatever the session's search_path.
			_, err = pool.Exec(ctx, `INSERT INTO pgrelay.outbox (topic, key) VALUES ('orders', 'o1'), ('orders', 'o1')`)
			require.NoError(t, err)
			var seqs string
			require.NoError(t, pool.QueryRow(ctx, `SELECT string_agg(key_seq::text, ',' ORDER BY id) FROM pgrelay.outbox`).Scan(&seqs))
			require.Equal(t, "1,2", seqs)
		})
	}
}

// publicEra is pgrelay's migrations as released before version 100, with
// every object in public and the versions in public.goose_db_version.
func publicEra(t *testing.T) fs.FS {
	t.Helper()
	return os.DirFS("testdata/public-v90")
}

// objects lists pgrelay's objects in a schema: relations (with their kind),
// functions (with their definitions, which name the schema), triggers,
// indexes and constraints, so that two installations can be compared.
func objects(t *testing.T, ctx context.Context, pool *pgxpool.Pool, schema string) []string {
	t.Helper()
	rows, err := pool.Query(ctx, `
		SELECT 'relation ' || c.relkind::text || ' ' || c.relname FROM pg_class c
		WHERE c.relnamespace = $1::regnamespace AND c.relname <> 'goose_db_version' AND c.relname <> 'goose_db_version_id_seq'
		UNION ALL
		SELECT 'function ' || p.oid::regprocedure::text || ' ' || pg_get_functiondef(p.oid) FROM pg_proc p
		WHERE p.pronamespace = $1::regnamespace
		UNION ALL
		SELECT 'trigger ' || pg_get_triggerdef(g.oid) FROM pg_trigger g JOIN pg_class c ON c.oid = g.tgrelid
		WHERE c.relnamespace = $1::regnamespace AND NOT g.tgisinternal
		UNION ALL
		SELECT 'index ' || pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
		WHERE c.relnamespace = $1::regnamespace AND c.relname <> 'goose_db_version'
		UNION ALL
		SELECT 'constraint ' || c.relname || ' ' || k.conname || ' ' || pg_get_constraintdef(k.oid) FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
		WHERE c.relnamespace = $1::regnamespace AND c.relname <> 'goose_db_version'
		UNION ALL
		SELECT 'column ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod) || ' ' || coalesce(pg_get_expr(d.adbin, d.adrelid), '')
		FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
		WHERE c.relnamespace = $1::regnamespace AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped AND c.relname <> 'goose_db_version'`, schema)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	sort.Strings(out)
	return out
}

// unqualified finds a pgrelay table, sequence or function named without its
// schema in SQL text.
var unqualified = regexp.MustCompile(`(?i)\b(?:FROM|JOIN|INTO|UPDATE|TABLE|ONLY)\s+(outbox_key_seqs|outbox|inbox_releases|inbox_conflicts|inbox_duplicates|inbox_receive_counts|inbox_key_state|inbox|relay_partitions|relay_nodes|relay_wakeups|replay_audit|http_idempotency_keys|guard_keys)\b[^.]|'(?:outbox_id_seq)'|[^\w.](?:outbox_partition_count|outbox_partition|outbox_uuidv7)\(`)

// TestFunctionsNameTheirSchema: no function of pgrelay's names one of
// pgrelay's objects without its schema, so nothing at run time depends on
// the session's search_path; a function added by a later migration with an
// unqualified body fails here.
func TestFunctionsNameTheirSchema(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool := testdb.New(t)
	rows, err := pool.Query(ctx, `SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid) FROM pg_proc p WHERE p.pronamespace = 'pgrelay'::regnamespace`)
	require.NoError(t, err)
	defs := map[string]string{}
	var name, def string
	_, err = pgx.ForEachRow(rows, []any{&name, &def}, func() error { defs[name] = def; return nil })
	require.NoError(t, err)
	require.Contains(t, defs, "pgrelay.outbox_before_insert()")
	for name, def := range defs {
		// The header names the function itself, schema-qualified.
		body := def[strings.Index(def, "\n"):]
		require.Empty(t, unqualified.FindAllString(body, -1), "%s:\n%s", name, def)
	}
}

// TestRunTimeIgnoresSearchPath: with a search_path that does not hold
// pgrelay (a pooled session, a service's own role settings), and a service's
// own outbox and outbox_key_seqs tables in public, every trigger path of
// pgrelay's tables works on pgrelay's objects only.
func TestRunTimeIgnoresSearchPath(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool := testdb.New(t)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	exec := func(q string) {
		t.Helper()
		_, err := conn.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	exec(`CREATE TABLE public.outbox (id int); CREATE TABLE public.outbox_key_seqs (key text, seq text); CREATE TABLE public.relay_wakeups (partition text)`)
	for _, path := range []string{"public", "pg_catalog", `"$user", public`} {
		exec(`SET search_path TO ` + path)
		exec(`UPDATE pgrelay.relay_wakeups SET armed = true`)
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `SET LOCAL transaction_isolation = 'repeatable read'`)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `INSERT INTO pgrelay.outbox (topic, key) VALUES ('t', 'k-rr')`)
		require.NoError(t, err, path)
		require.NoError(t, tx.Commit(ctx))
		exec(`INSERT INTO pgrelay.outbox (topic, key) VALUES ('t', 'k'), ('t', 'k'), ('t', '')`)
		exec(`UPDATE pgrelay.outbox SET key = 'k2' WHERE key = 'k' AND key_seq = 2`)
		exec(`UPDATE pgrelay.outbox SET status = 'dead' WHERE key = 'k2'`)
		exec(`DELETE FROM pgrelay.outbox WHERE key = 'k'`)
		exec(`TRUNCATE pgrelay.outbox`)
		exec(`INSERT INTO pgrelay.inbox (event_id, topic) VALUES ('e-` + path + `', 't')`)
	}
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM public.outbox) + (SELECT count(*) FROM public.outbox_key_seqs) + (SELECT count(*) FROM public.relay_wakeups)`).Scan(&n))
	require.Zero(t, n, "the service's tables are untouched")
	// k: 1, 2 (2 becomes k2's), 1 deleted; 2, 3 (3 deleted); 4, 5 deleted.
	require.NoError(t, pool.QueryRow(ctx, `SELECT max(seq) FROM pgrelay.outbox_key_seqs WHERE key = 'k'`).Scan(&n))
	require.Equal(t, 5, n, "the DELETE trigger kept the key's floor in pgrelay")
	require.NoError(t, pool.QueryRow(ctx, `SELECT max(seq) FROM pgrelay.outbox_key_seqs WHERE key = 'k2'`).Scan(&n))
	require.Equal(t, 2, n, "the TRUNCATE trigger kept the key's floor in pgrelay")
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pgrelay.relay_wakeups WHERE NOT armed`).Scan(&n))
	require.Positive(t, n, "the wake-up trigger disarmed pgrelay's flags")
}

// TestMigrationsSetTheirSearchPath: every migration's Up and Down part
// starts by choosing where pgrelay's objects are (docs/schema.md, "Writing
// migrations"); a migration without it would create its objects in public
// on a new installation. Version 1 creates the schema (unless it exists)
// and always uses it.
func TestMigrationsSetTheirSearchPath(t *testing.T) {
	t.Parallel()
	const line = `SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);`
	names, err := fs.Glob(migrations.FS, "*.sql")
	require.NoError(t, err)
	for _, n := range names {
		b, err := fs.ReadFile(migrations.FS, n)
		require.NoError(t, err)
		var part string
		sc := bufio.NewScanner(strings.NewReader(string(b)))
		for sc.Scan() {
			l := strings.TrimSpace(sc.Text())
			switch {
			case l == "-- +goose Up" || l == "-- +goose Down":
				part = l
			case part != "" && (l == "" || strings.HasPrefix(l, "--") && !strings.HasPrefix(l, "-- +goose")):
			case part != "":
				if n == "00001_inbox.sql" && part == "-- +goose Up" {
					// Creates the schema (in a DO block), then uses it.
					create, set := strings.Index(string(b), "CREATE SCHEMA pgrelay;"), strings.Index(string(b), "SET LOCAL search_path TO pgrelay;")
					require.True(t, create >= 0 && create < set && set < strings.Index(string(b), "CREATE TABLE inbox"), n)
					part = ""
					continue
				}
				require.Equal(t, line, l, "%s: the first statement of %q", n, part)
				part = ""
			}
		}
	}
}

// TestSqlcSchemaListsEveryTable: internal/db/pgrelay_schema.sql, which shows
// sqlc where the migrations put pgrelay's tables, names every one of them.
func TestSqlcSchemaListsEveryTable(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool := testdb.New(t)
	rows, err := pool.Query(ctx, `SELECT tablename FROM pg_tables WHERE schemaname = 'pgrelay' AND tablename <> 'goose_db_version' ORDER BY 1`)
	require.NoError(t, err)
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	b, err := os.ReadFile("../internal/db/pgrelay_schema.sql")
	require.NoError(t, err)
	var listed []string
	for _, m := range regexp.MustCompile(`(?m)^ALTER TABLE (\w+) SET SCHEMA pgrelay;$`).FindAllStringSubmatch(string(b), -1) {
		listed = append(listed, m[1])
	}
	sort.Strings(listed)
	require.Equal(t, tables, listed)
}

// TestMigrateWithoutCreateOnTheDatabase: a migrating role that may not
// create schemas in the database migrates into a schema pgrelay a DBA
// created for it (CREATE SCHEMA IF NOT EXISTS would be refused even then).
func TestMigrateWithoutCreateOnTheDatabase(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	url := testdb.EmptyURL(t)
	admin, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	defer admin.Close()
	role := fmt.Sprintf("pgrelay_migrator_%d", time.Now().UnixNano())
	var dbName string
	require.NoError(t, admin.QueryRow(ctx, `SELECT current_database()`).Scan(&dbName))
	for _, q := range []string{
		`CREATE ROLE ` + role + ` LOGIN`,
		`REVOKE CREATE ON DATABASE ` + dbName + ` FROM PUBLIC`,
		`CREATE SCHEMA pgrelay AUTHORIZATION ` + role,
	} {
		_, err := admin.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		base, err := pgx.Connect(ctx, testdb.ServerURL(t))
		if err != nil {
			return
		}
		defer base.Close(ctx)
		_, _ = base.Exec(ctx, `DROP DATABASE IF EXISTS `+dbName+` WITH (FORCE)`)
		_, _ = base.Exec(ctx, `DROP ROLE IF EXISTS `+role)
	})
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.ConnConfig.User = role
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()
	_, err = pool.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS pgrelay`)
	require.ErrorContains(t, err, "permission denied for database", "the role may not create schemas")
	require.NoError(t, migrations.Up(ctx, sqlDB))
	allApplied(t, ctx, sqlDB)
}
