-- +goose Up
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
-- The inbox's identity becomes (handler, dedup_key): an event is processed once
-- per named handler, and each handler chooses how its dedup key is built
-- (message id, business key, content hash, hybrid; internal/inbox/keys.go).
--
-- handler       the named handler the row belongs to. Rows stored before this
--               migration belong to the handler named 'default', the name a
--               consumer runs under when none is configured. Receive checks
--               the name's characters; the table only bounds its length (a
--               regular expression here cost a third of the insert).
-- dedup_key     the key the handler's strategy built (the event id for the
--               message-id strategy). The primary key is (handler, dedup_key).
-- key_strategy  the strategy's spec (for example 'business:payment:{order_id}'),
--               shown in statistics.
-- fingerprint   SHA-256 of the payload bytes. A redelivery whose key is stored
--               but whose fingerprint differs is a conflict (inbox_conflicts).
--
-- Receive fills dedup_key and fingerprint itself. A plain-SQL INSERT naming
-- only event_id still stores a 'default', message-id row: a BEFORE trigger
-- fills what is missing; its WHEN clause is evaluated without calling the
-- function, so Receive's inserts pay nothing for it. Stored generated columns
-- were measured instead: they made every insert about twice as slow.
--
-- Cost: the backfill rewrites the table once (every row hashed), and the
-- primary key and claim indexes are rebuilt; the inbox holds one dedup window
-- of rows.
ALTER TABLE inbox
    ADD COLUMN handler      text NOT NULL DEFAULT 'default'
        CONSTRAINT inbox_handler_check CHECK (handler <> '' AND length(handler) <= 63),
    ADD COLUMN key_strategy text NOT NULL DEFAULT 'message-id',
    ADD COLUMN dedup_key    text,
    ADD COLUMN fingerprint  bytea;
UPDATE inbox SET dedup_key = event_id, fingerprint = sha256(payload);
ALTER TABLE inbox
    ALTER COLUMN dedup_key SET NOT NULL,
    ALTER COLUMN fingerprint SET NOT NULL;

-- +goose StatementBegin
CREATE FUNCTION inbox_identity_defaults() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.dedup_key := coalesce(NEW.dedup_key, NEW.event_id);
    NEW.fingerprint := coalesce(NEW.fingerprint, sha256(NEW.payload));
    RETURN NEW;
END;
$$;
-- +goose StatementEnd
CREATE TRIGGER inbox_identity_defaults BEFORE INSERT ON inbox
    FOR EACH ROW WHEN (NEW.dedup_key IS NULL OR NEW.fingerprint IS NULL)
    EXECUTE FUNCTION inbox_identity_defaults();

ALTER TABLE inbox DROP CONSTRAINT inbox_pkey;
ALTER TABLE inbox ADD CONSTRAINT inbox_pkey PRIMARY KEY (handler, dedup_key);
-- Operators and handlers still look events up by event id (one row per handler).
CREATE INDEX inbox_event_id_idx ON inbox (event_id);

-- Workers claim per handler.
DROP INDEX inbox_pending_idx;
CREATE INDEX inbox_pending_idx ON inbox (handler, next_attempt_at) WHERE status = 'pending';
DROP INDEX inbox_processing_idx;
CREATE INDEX inbox_processing_idx ON inbox (handler, locked_until) WHERE status = 'processing';

-- inbox_conflicts keeps every delivery whose dedup key was already stored for
-- its handler with a different payload fingerprint. The stored event's effect
-- stands; the conflicting delivery is not processed, and is kept here for an
-- operator (consumer conflicts list, GET /admin/inbox/conflicts).
CREATE TABLE inbox_conflicts (
    id                  bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    handler             text        NOT NULL,
    dedup_key           text        NOT NULL,
    key_strategy        text        NOT NULL,
    stored_event_id     text        NOT NULL,
    event_id            text        NOT NULL,
    stored_fingerprint  bytea       NOT NULL,
    fingerprint         bytea       NOT NULL,
    topic               text        NOT NULL DEFAULT '',
    event_type          text        NOT NULL DEFAULT '',
    payload             bytea       NOT NULL DEFAULT '\x',
    detected_at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX inbox_conflicts_handler_idx ON inbox_conflicts (handler, id);
CREATE INDEX inbox_conflicts_detected_idx ON inbox_conflicts (detected_at);

-- Operator actions on inbox dead letters name the handler whose row they
-- touched (NULL for the outbox and for records written before).
ALTER TABLE replay_audit ADD COLUMN handler text;

-- +goose Down
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
-- Rolling back restores event_id as the only key. It refuses while rows of a
-- handler other than 'default', rows keyed by another strategy, or recorded
-- conflicts exist (they would be lost, or collide on event_id); with
-- pgrelay.force_down=on those rows are deleted.
-- +goose StatementBegin
DO $$
BEGIN
    IF lower(coalesce(current_setting('pgrelay.force_down', true), '')) NOT IN ('on', 'true', 'yes', '1')
       AND (EXISTS (SELECT 1 FROM inbox WHERE handler <> 'default' OR dedup_key <> event_id)
            OR EXISTS (SELECT 1 FROM inbox_conflicts)) THEN
        RAISE EXCEPTION 'migrate down: 00070_inbox_identity would drop data: the inbox holds rows of named handlers or of a key strategy other than message-id, or recorded key conflicts; to drop them anyway set pgrelay.force_down=on (relay|consumer migrate down --force, or PGOPTIONS="-c pgrelay.force_down=on" with the goose CLI)'
            USING ERRCODE = 'dependent_objects_still_exist';
    END IF;
END $$;
-- +goose StatementEnd
DELETE FROM inbox WHERE handler <> 'default' OR dedup_key <> event_id;
ALTER TABLE replay_audit DROP COLUMN handler;
DROP TABLE inbox_conflicts;
DROP INDEX inbox_processing_idx;
CREATE INDEX inbox_processing_idx ON inbox (locked_until) WHERE status = 'processing';
DROP INDEX inbox_pending_idx;
CREATE INDEX inbox_pending_idx ON inbox (next_attempt_at) WHERE status = 'pending';
DROP INDEX inbox_event_id_idx;
ALTER TABLE inbox DROP CONSTRAINT inbox_pkey;
DROP TRIGGER inbox_identity_defaults ON inbox;
DROP FUNCTION inbox_identity_defaults();
ALTER TABLE inbox
    DROP COLUMN fingerprint,
    DROP COLUMN dedup_key,
    DROP COLUMN key_strategy,
    DROP COLUMN handler;
ALTER TABLE inbox ADD CONSTRAINT inbox_pkey PRIMARY KEY (event_id);
