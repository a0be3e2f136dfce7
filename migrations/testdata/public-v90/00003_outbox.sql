-- +goose Up
-- The outbox: events applications write in their own transactions, published
-- onward by the relay.
--
-- Plain-SQL producers need only:
--   INSERT INTO outbox (topic, key, event_type, payload) VALUES (...);
-- The defaults and the outbox_before_insert trigger fill in the rest.

-- outbox_partition_count is the number of relay partitions, fixed at install.
-- Changing it needs a migration that also re-seeds relay_partitions and
-- recomputes the partition of pending rows.
CREATE FUNCTION outbox_partition_count() RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 16';

-- outbox_partition maps an ordering key onto its relay partition.
CREATE FUNCTION outbox_partition(key text) RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS 'SELECT ((hashtext(key)::bigint % outbox_partition_count()) + outbox_partition_count())::integer % outbox_partition_count()';

-- outbox_uuidv7 returns a time-ordered UUID (version 7), the default event id.
CREATE FUNCTION outbox_uuidv7() RETURNS uuid
    LANGUAGE sql VOLATILE PARALLEL SAFE
    AS $$
    SELECT encode(
        set_bit(set_bit(
            overlay(uuid_send(gen_random_uuid())
                    PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
                    FROM 1 FOR 6),
            52, 1), 53, 1),
        'hex')::uuid
    $$;

-- outbox_id_seq numbers outbox rows. The id is assigned by the BEFORE INSERT
-- trigger only after it holds the key's lock, so that for one key id order is
-- commit order (column defaults are evaluated before BEFORE triggers run, so a
-- default could not give that guarantee).
CREATE SEQUENCE outbox_id_seq AS bigint;

CREATE TABLE outbox (
    id              bigint      PRIMARY KEY,
    event_id        text        NOT NULL DEFAULT outbox_uuidv7()::text
                    CHECK (event_id <> '' AND length(event_id) <= 255),
    topic           text        NOT NULL CHECK (topic <> ''),
    key             text        NOT NULL DEFAULT '',
    event_type      text        NOT NULL DEFAULT '',
    payload         bytea       NOT NULL DEFAULT '\x',
    headers         jsonb       NOT NULL DEFAULT '{}'::jsonb,
    occurred_at     timestamptz NOT NULL DEFAULT now(),
    created_at      timestamptz NOT NULL DEFAULT now(),
    status          text        NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'published', 'dead')),
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz,
    published_at    timestamptz,
    last_error      text,
    partition       integer     NOT NULL GENERATED ALWAYS AS (outbox_partition(key)) STORED,
    CONSTRAINT outbox_event_id_key UNIQUE (event_id)
);
ALTER SEQUENCE outbox_id_seq OWNED BY outbox.id;

-- The relay reads only this partial index: a claim touches O(batch) rows
-- however many published or dead rows the table holds.
CREATE INDEX outbox_pending_idx ON outbox (partition, id) WHERE status = 'pending';
-- Retention deletes published rows oldest first.
CREATE INDEX outbox_published_idx ON outbox (published_at) WHERE status = 'published';
CREATE INDEX outbox_dead_idx ON outbox (id) WHERE status = 'dead';

-- +goose StatementBegin
-- outbox_before_insert defaults the key to the event id, serializes writers of
-- the same key with a transaction-scoped advisory lock, and only then assigns
-- the id. Writers of one key therefore get ids in commit order, which is what
-- lets the relay publish in id order without ever skipping a late commit.
CREATE FUNCTION outbox_before_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.key IS NULL OR NEW.key = '' THEN
        -- No ordering key: the event is ordered with nothing, so no lock.
        NEW.key := NEW.event_id;
    ELSE
        PERFORM pg_advisory_xact_lock(1885434465, hashtext(NEW.key));
    END IF;
    NEW.id := nextval('outbox_id_seq');
    NEW.status := 'pending';
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER outbox_before_insert BEFORE INSERT ON outbox
    FOR EACH ROW EXECUTE FUNCTION outbox_before_insert();

-- +goose StatementBegin
-- outbox_notify wakes the relays, naming the partitions that got rows (a
-- comma-separated list), so only those partitions' workers look for work.
CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('pgrelay_outbox', (SELECT string_agg(DISTINCT partition::text, ',') FROM new_rows));
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER outbox_notify_insert AFTER INSERT ON outbox
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();

-- +goose Down
-- Rolling back refuses while the outbox holds events not yet published or dead:
-- set pgrelay.force_down=on to drop it anyway (README, "Migrations").
-- +goose StatementBegin
DO $$
BEGIN
    IF lower(coalesce(current_setting('pgrelay.force_down', true), '')) NOT IN ('on', 'true', 'yes', '1')
       AND EXISTS (SELECT 1 FROM outbox WHERE status <> 'published') THEN
        RAISE EXCEPTION 'migrate down: 00003_outbox would drop data: the outbox holds events not yet published or dead; to drop it anyway set pgrelay.force_down=on (relay|consumer migrate down --force, or PGOPTIONS="-c pgrelay.force_down=on" with the goose CLI)'
            USING ERRCODE = 'dependent_objects_still_exist';
    END IF;
END $$;
-- +goose StatementEnd
DROP TABLE outbox;
DROP FUNCTION outbox_notify();
DROP FUNCTION outbox_before_insert();
DROP FUNCTION outbox_uuidv7();
DROP FUNCTION outbox_partition(text);
DROP FUNCTION outbox_partition_count();
