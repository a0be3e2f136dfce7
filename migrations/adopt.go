package migrations

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/pressly/goose/v3/lock"
)

// Before version 100, pgrelay's objects lived in public and goose recorded
// pgrelay's versions in public.goose_db_version, the table most services that
// use goose already have: an application's version 1 or 3 was taken as
// pgrelay's, or pgrelay's as the application's. pgrelay now has its own
// version table, pgrelay.goose_db_version. Adopting an older installation
// copies into it the versions in public.goose_db_version that are pgrelay's,
// told apart from the application's by pgrelay's objects: a version is
// adopted when it is recorded as applied there AND the object it created (or
// the change it made) is present in public. Rows of public.goose_db_version
// are never changed or deleted: pgrelay's old rows stay there (docs/schema.md
// gives an optional clean-up statement).

// probe is what a version of the public era left behind, as a boolean SQL
// expression over the public schema.
type probe struct {
	version int64
	expr    string
}

func tbl(name string) string {
	return fmt.Sprintf("pg_catalog.to_regclass('public.%s') IS NOT NULL", name)
}

func col(table, column string) string {
	return fmt.Sprintf("EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('public.%s') AND attname = '%s' AND NOT attisdropped)", table, column)
}

func fn(sig string) string {
	return fmt.Sprintf("pg_catalog.to_regprocedure('public.%s') IS NOT NULL", sig)
}

func trg(table, name string) string {
	return fmt.Sprintf("EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('public.%s') AND tgname = '%s')", table, name)
}

func and(exprs ...string) string { return "(" + strings.Join(exprs, " AND ") + ")" }

// probes lists every version of the public era (up to 90) with what it left
// in the database. A version added later never ran in public and needs none.
var probes = []probe{
	{1, and(tbl("inbox_releases"), col("inbox", "lock_version"))},
	{3, and(fn("outbox_uuidv7()"), trg("outbox", "outbox_before_insert"))},
	{4, and(col("relay_partitions", "epoch"), tbl("relay_nodes"))},
	{10, col("replay_audit", "previous_error")},
	{11, and(col("outbox", "dead_at"), trg("outbox", "outbox_set_dead_at"))},
	// outbox_partition got a SQL-standard body.
	{30, "EXISTS (SELECT 1 FROM pg_proc WHERE oid OPERATOR(pg_catalog.=) pg_catalog.to_regprocedure('public.outbox_partition(text)') AND prosqlbody IS NOT NULL)"},
	{31, col("relay_wakeups", "armed")},
	// The inbox's notify trigger was dropped.
	{35, and(col("inbox", "lock_version"), "NOT "+fn("inbox_notify()"), "NOT "+trg("inbox", "inbox_notify_insert"))},
	{45, "EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('public.outbox') AND conname = 'outbox_occurred_at_range')"},
	{50, and(col("http_idempotency_keys", "fingerprint"), col("guard_keys", "token"))},
	// outbox_notify skips locked flag rows.
	{55, "EXISTS (SELECT 1 FROM pg_proc WHERE oid OPERATOR(pg_catalog.=) pg_catalog.to_regprocedure('public.outbox_notify()') AND prosrc LIKE '%SKIP LOCKED%')"},
	{60, col("inbox", "handler_status")},
	// 65 created nothing (it only forgot the example's versions): what the
	// version after it created shows it ran, goose applying in order.
	{65, and(tbl("inbox_conflicts"), col("inbox", "dedup_key"))},
	{70, and(tbl("inbox_conflicts"), col("inbox", "dedup_key"))},
	{80, and(col("inbox_duplicates", "original_received_at"), col("inbox_receive_counts", "backend"))},
	{85, and(col("outbox_key_seqs", "seq"), col("outbox", "key_seq"))},
	{86, and(tbl("inbox_key_state"), col("inbox", "key_seq"))},
	{90, fn("outbox_set_partition()")},
}

// adoptableQuery selects (version, applied at) of the versions to adopt; it
// reads public.goose_db_version, so run it only when that table exists.
func adoptableQuery() string {
	values := make([]string, len(probes))
	for i, p := range probes {
		values[i] = fmt.Sprintf("(%d, %s)", p.version, p.expr)
	}
	return `SELECT v.version, g.tstamp
FROM (VALUES
    ` + strings.Join(values, ",\n    ") + `
) AS v(version, present)
CROSS JOIN LATERAL (SELECT o.is_applied, o.tstamp FROM public.goose_db_version o
                    WHERE o.version_id = v.version ORDER BY o.id DESC LIMIT 1) AS g
WHERE v.present AND g.is_applied`
}

// AdoptSQL creates the schema pgrelay and, when pgrelay's version table
// records no version yet (it does not exist, or holds only goose's version
// 0) but an older installation recorded pgrelay's versions in
// public.goose_db_version, records those versions in pgrelay.goose_db_version
// (creating it, with goose's version 0, if needed). It is one statement, idempotent, and
// holds goose's migration lock while it runs. The provider runs it before
// every migration; goose CLI users upgrading an older installation run it
// once (relay migrate sql --adopt).
var AdoptSQL = fmt.Sprintf(`DO $adopt$
DECLARE
    versions bigint[];
    stamps   timestamp[];
BEGIN
    -- Built-ins resolve to pg_catalog whatever the caller's search_path.
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog', true);
    -- goose's migration lock: no migration runs meanwhile.
    PERFORM pg_advisory_xact_lock(%d);
    -- Not CREATE SCHEMA IF NOT EXISTS: that needs the CREATE privilege on
    -- the database even when the schema exists (created by a DBA for a
    -- migrating role that lacks it).
    IF to_regnamespace('pgrelay') IS NULL THEN
        CREATE SCHEMA pgrelay;
    END IF;
    IF to_regclass('public.goose_db_version') IS NULL THEN
        RETURN;
    END IF;
    -- Adopted already, or pgrelay's own versions recorded there: nothing to
    -- do. (A table holding only goose's version 0 is one the goose CLI
    -- created before its first migration failed: still to adopt into.)
    IF to_regclass('pgrelay.goose_db_version') IS NOT NULL THEN
        IF EXISTS (SELECT 1 FROM pgrelay.goose_db_version WHERE version_id > 0) THEN
            RETURN;
        END IF;
    END IF;
    SELECT array_agg(a.version ORDER BY a.version), array_agg(a.tstamp ORDER BY a.version)
    INTO versions, stamps
    FROM (
%s
    ) AS a;
    IF versions IS NULL THEN
        -- No pgrelay version in public.goose_db_version (it is the
        -- application's own): goose creates pgrelay's table.
        RETURN;
    END IF;
    -- goose's own definition of its Postgres version table.
    CREATE TABLE IF NOT EXISTS pgrelay.goose_db_version (
        id integer PRIMARY KEY GENERATED BY DEFAULT AS IDENTITY,
        version_id bigint NOT NULL,
        is_applied boolean NOT NULL,
        tstamp timestamp NOT NULL DEFAULT now()
    );
    INSERT INTO pgrelay.goose_db_version (version_id, is_applied)
    SELECT 0, true WHERE NOT EXISTS (SELECT 1 FROM pgrelay.goose_db_version WHERE version_id = 0);
    INSERT INTO pgrelay.goose_db_version (version_id, is_applied, tstamp)
    SELECT v, true, s FROM unnest(versions, stamps) AS u(v, s) ORDER BY v;
    COMMENT ON TABLE pgrelay.goose_db_version IS 'pgrelay''s goose versions; adopted from public.goose_db_version';
END $adopt$`, lock.DefaultLockID, indent(adoptableQuery(), "        "))

func indent(s, prefix string) string {
	return prefix + strings.ReplaceAll(s, "\n", "\n"+prefix)
}

// adoptableVersions returns the versions AdoptSQL would adopt (none when
// public.goose_db_version does not exist), reading only.
func adoptableVersions(ctx context.Context, db *sql.DB) ([]int64, error) {
	var exists bool
	if err := db.QueryRowContext(ctx, `SELECT pg_catalog.to_regclass('public.goose_db_version') IS NOT NULL`).Scan(&exists); err != nil {
		return nil, fmt.Errorf("migrations: read the schema version: %w", err)
	}
	if !exists {
		return nil, nil
	}
	rows, err := db.QueryContext(ctx, `SELECT version FROM (`+adoptableQuery()+`) AS a ORDER BY 1`)
	if err != nil {
		return nil, fmt.Errorf("migrations: read an older installation's versions: %w", err)
	}
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			return nil, fmt.Errorf("migrations: read an older installation's versions: %w", err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("migrations: read an older installation's versions: %w", err)
	}
	return out, nil
}
