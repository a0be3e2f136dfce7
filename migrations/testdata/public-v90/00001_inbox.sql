-- +goose Up
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
