-- +goose Up
-- Every pgrelay object lives in the schema pgrelay (docs/schema.md). Each
-- migration begins by setting the search_path for its own transaction, so
-- that the names it uses resolve where pgrelay's objects are: in pgrelay,
-- or, on an installation made before version 100 (which moves them into
-- pgrelay), still in public, as when it was released. The test is whether
-- pgrelay's inbox_releases (created here, dropped only by rolling this
-- back) is in public and not in pgrelay. This first migration always
-- creates its objects in pgrelay.
-- An installation made before version 100 keeps its objects in public and its
-- versions in public.goose_db_version: applying version 1 again (the goose CLI
-- pointed at a new, empty version table) would install pgrelay a second time.
-- relay|consumer migrate up adopts the old versions first; goose CLI users run
-- `relay migrate sql --adopt` once (docs/schema.md).
-- The schema is created only when missing: CREATE SCHEMA IF NOT EXISTS would
-- need the CREATE privilege on the database even when a DBA created the
-- schema beforehand for a role that lacks it.
-- goose records each version in the table it was given in the migration's own
-- transaction: it must be pgrelay.goose_db_version (the goose CLI's -table),
-- which the search_path set below resolves; any other is refused here, before
-- anything is installed, naming the command.
-- +goose StatementBegin
DO $$
DECLARE
    use_table text := $m$goose must record pgrelay's versions in pgrelay.goose_db_version: run goose -dir migrations -table pgrelay.goose_db_version postgres "$DATABASE_URL" up (a new database needs the schema first: psql "$DATABASE_URL" -c 'CREATE SCHEMA IF NOT EXISTS pgrelay'; an installation made before version 100 adopts its versions once first: relay migrate sql --adopt | psql "$DATABASE_URL"; docs/schema.md)$m$;
BEGIN
    IF pg_catalog.to_regclass('pgrelay.goose_db_version') IS NULL THEN
        RAISE EXCEPTION '%', use_table USING ERRCODE = 'undefined_table';
    ELSIF EXISTS (SELECT 1 FROM pgrelay.goose_db_version WHERE version_id OPERATOR(pg_catalog.=) 1 AND is_applied) THEN
        RAISE EXCEPTION 'pgrelay is already installed (version 1 is recorded in pgrelay.goose_db_version): %', use_table
            USING ERRCODE = 'duplicate_schema';
    END IF;
    IF to_regclass('public.inbox_releases') IS NOT NULL AND to_regclass('pgrelay.inbox') IS NULL
       AND EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('public.inbox') AND attname = 'lock_version' AND NOT attisdropped) THEN
        RAISE EXCEPTION 'pgrelay is already installed in schema public, recorded in public.goose_db_version: adopt its versions into pgrelay.goose_db_version first (relay migrate up does it; with the goose CLI run the output of `relay migrate sql --adopt` once; docs/schema.md)'
            USING ERRCODE = 'duplicate_schema';
    END IF;
    IF to_regnamespace('pgrelay') IS NULL THEN
        CREATE SCHEMA pgrelay;
    END IF;
END $$;
-- +goose StatementEnd
SET LOCAL search_path TO pgrelay;
-- The inbox: every message a consumer received, deduplicated by event_id.
CREATE TABLE inbox (
    event_id        text        PRIMARY KEY CHECK (event_id <> '' AND length(event_id) <= 255),
    topic           text        NOT NULL DEFAULT '',
    key             text        NOT NULL DEFAULT '',
    event_type      text        NOT NULL DEFAULT '',
    payload         bytea       NOT NULL DEFAULT '\x',
    headers         jsonb       NOT NULL DEFAULT '{}'::jsonb,
    occurred_at     timestamptz NOT NULL DEFAULT now(),
    received_at     timestamptz NOT NULL DEFAULT now(),
    status          text        NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'processing', 'processed', 'dead')),
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    locked_by       text,
    locked_until    timestamptz,
    lock_version    bigint      NOT NULL DEFAULT 0,
    started_at      timestamptz,
    finished_at     timestamptz,
    last_error      text,
    -- waiting_for names what a deferred event waits on (for example 'order:42');
    -- the event is woken early when that dependency is released.
    waiting_for     text,
    deferrals       integer     NOT NULL DEFAULT 0
);

-- Claims only ever look at these partial indexes, so a claim touches O(batch)
-- rows however many processed rows the table holds.
CREATE INDEX inbox_pending_idx ON inbox (next_attempt_at) WHERE status = 'pending';
CREATE INDEX inbox_processing_idx ON inbox (locked_until) WHERE status = 'processing';
CREATE INDEX inbox_waiting_idx ON inbox (waiting_for) WHERE status = 'pending' AND waiting_for IS NOT NULL;
CREATE INDEX inbox_processed_idx ON inbox (finished_at) WHERE status = 'processed';
CREATE INDEX inbox_dead_idx ON inbox (finished_at) WHERE status = 'dead';

-- inbox_releases remembers which dependencies were released (see inbox.Release),
-- so that an event deferring on a dependency released concurrently by another
-- transaction is made due at once instead of waiting for its fallback.
CREATE TABLE inbox_releases (
    waiting_for text        PRIMARY KEY,
    released_at timestamptz NOT NULL DEFAULT now()
);
-- No index on released_at: it would cost every release a write, and workers
-- keep the table small (PruneInboxReleases), so pruning scans it.

-- +goose StatementBegin
CREATE FUNCTION inbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('pgrelay_inbox', '');
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER inbox_notify_insert AFTER INSERT ON inbox
    FOR EACH STATEMENT EXECUTE FUNCTION inbox_notify();

-- +goose Down
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
-- Rolling back refuses while the inbox holds events (pending, dead, or processed ones that absorb redeliveries):
-- set pgrelay.force_down=on to drop it anyway (README, "Migrations").
-- +goose StatementBegin
DO $$
BEGIN
    IF lower(coalesce(current_setting('pgrelay.force_down', true), '')) NOT IN ('on', 'true', 'yes', '1')
       AND EXISTS (SELECT 1 FROM inbox) THEN
        RAISE EXCEPTION 'migrate down: 00001_inbox would drop data: the inbox holds events (pending, dead, or processed ones that absorb redeliveries); to drop it anyway set pgrelay.force_down=on (relay|consumer migrate down --force, or PGOPTIONS="-c pgrelay.force_down=on" with the goose CLI)'
            USING ERRCODE = 'dependent_objects_still_exist';
    END IF;
END $$;
-- +goose StatementEnd
DROP TABLE inbox_releases;
DROP TABLE inbox;
DROP FUNCTION inbox_notify();
