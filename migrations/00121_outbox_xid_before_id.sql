-- +goose Up
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
-- The outbox's insert trigger takes the transaction's id (xid) before the
-- row's id. Nothing else changes. The relay's claims start their scan past
-- the rows already published (relay/floor.go, docs/relay.md "Scan floor"):
-- it passes a row id only once the oldest running xid is past the xid of a
-- mark made after a claim that saw a higher id. That holds only if every
-- transaction that drew a lower id already had its xid then; without this
-- call a transaction gets its xid at the row's heap insert, after the
-- trigger drew the id (nextval takes one only for the one call in 32 that
-- writes WAL), and a claim in between could not know it was there. The xid
-- is the one the insert would take a moment later. A relay serving a
-- database below this version has no floor: its claims scan from the start.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_before_insert() RETURNS trigger LANGUAGE plpgsql
SET enable_seqscan = off SET search_path = pg_catalog, pgrelay AS $$
DECLARE
    stored   boolean;
    next_seq bigint;
    mine     boolean;
BEGIN
    NEW.key_seq := NULL;
    IF NEW.key IS NULL OR NEW.key = '' THEN
        -- No ordering key: the event is ordered with nothing, so no lock.
        NEW.key := NEW.event_id;
    ELSIF NEW.key = NEW.event_id THEN
        -- A key equal to the event's own id is the default key: no sequence.
        PERFORM pg_advisory_xact_lock(1885434465, hashtext(NEW.key));
    ELSE
        PERFORM pg_advisory_xact_lock(1885434465, hashtext(NEW.key));
        IF current_setting('transaction_isolation') = 'read committed' THEN
            -- A new snapshot, taken after the lock: every earlier producer of
            -- the key is visible.
            SELECT greatest(coalesce((SELECT max(o.key_seq) FROM pgrelay.outbox o
                                      WHERE o.key = NEW.key AND o.key_seq IS NOT NULL), 0),
                            coalesce((SELECT s.seq FROM pgrelay.outbox_key_seqs s WHERE s.key = NEW.key), 0)) + 1
            INTO next_seq;
            NEW.key_seq := next_seq;
        ELSE
            -- One statement (one snapshot): whether the event id is already
            -- stored (an idempotent retry the insert will skip: it must not
            -- write the counter), the next number, and whether this
            -- transaction already wrote the key's counter (00085).
            SELECT EXISTS (SELECT 1 FROM pgrelay.outbox o WHERE o.event_id = NEW.event_id),
                   greatest(coalesce((SELECT max(o.key_seq) FROM pgrelay.outbox o
                                      WHERE o.key = NEW.key AND o.key_seq IS NOT NULL), 0),
                            coalesce(s.seq, 0)) + 1,
                   coalesce(s.xmin = pg_current_xact_id()::xid, false)
            INTO stored, next_seq, mine
            FROM (SELECT 1) AS one
            LEFT JOIN pgrelay.outbox_key_seqs s ON s.key = NEW.key;
            IF NOT stored THEN
                IF NOT mine THEN
                    INSERT INTO pgrelay.outbox_key_seqs AS s (key, seq) VALUES (NEW.key, next_seq)
                    ON CONFLICT (key) DO UPDATE SET seq = greatest(s.seq, excluded.seq);
                END IF;
                NEW.key_seq := next_seq;
            END IF;
        END IF;
    END IF;
    -- The transaction's id first, then the row's: a relay's claim that saw a
    -- committed row knows every row with a lower id belongs to a transaction
    -- that had its id before that claim (relay/floor.go).
    PERFORM pg_current_xact_id();
    NEW.id := nextval('pgrelay.outbox_id_seq');
    NEW.status := 'pending';
    NEW.partition := pgrelay.outbox_partition(NEW.key);
    -- The row rules (formerly CHECK constraints; one that is NULL passes, as
    -- there), in one expression; outbox_refuse names the rule that failed.
    IF NOT (coalesce(NEW.event_id <> '' AND length(NEW.event_id) <= 255, true)
            AND coalesce(octet_length(NEW.key) <= 1024, true)
            AND coalesce(NEW.occurred_at > '0001-01-01 00:00:00+00'::timestamptz
                         AND NEW.occurred_at < '10000-01-01 00:00:00+00'::timestamptz, true)
            AND coalesce(NEW.topic <> '' AND octet_length(NEW.topic) <= 255
                         AND NEW.topic ~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$', true)
            AND coalesce(octet_length(NEW.traceparent) <= 255 AND octet_length(NEW.tracestate) <= 4096, true)) THEN
        PERFORM pgrelay.outbox_refuse(TG_TABLE_SCHEMA, TG_TABLE_NAME, NEW.event_id, NEW.key, NEW.occurred_at,
                                      NEW.status, NEW.topic, NEW.traceparent, NEW.tracestate);
    END IF;
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

-- +goose Down
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_before_insert() RETURNS trigger LANGUAGE plpgsql
SET enable_seqscan = off SET search_path = pg_catalog, pgrelay AS $$
DECLARE
    stored   boolean;
    next_seq bigint;
    mine     boolean;
BEGIN
    NEW.key_seq := NULL;
    IF NEW.key IS NULL OR NEW.key = '' THEN
        -- No ordering key: the event is ordered with nothing, so no lock.
        NEW.key := NEW.event_id;
    ELSIF NEW.key = NEW.event_id THEN
        -- A key equal to the event's own id is the default key: no sequence.
        PERFORM pg_advisory_xact_lock(1885434465, hashtext(NEW.key));
    ELSE
        PERFORM pg_advisory_xact_lock(1885434465, hashtext(NEW.key));
        IF current_setting('transaction_isolation') = 'read committed' THEN
            -- A new snapshot, taken after the lock: every earlier producer of
            -- the key is visible.
            SELECT greatest(coalesce((SELECT max(o.key_seq) FROM pgrelay.outbox o
                                      WHERE o.key = NEW.key AND o.key_seq IS NOT NULL), 0),
                            coalesce((SELECT s.seq FROM pgrelay.outbox_key_seqs s WHERE s.key = NEW.key), 0)) + 1
            INTO next_seq;
            NEW.key_seq := next_seq;
        ELSE
            -- One statement (one snapshot): whether the event id is already
            -- stored (an idempotent retry the insert will skip: it must not
            -- write the counter), the next number, and whether this
            -- transaction already wrote the key's counter (00085).
            SELECT EXISTS (SELECT 1 FROM pgrelay.outbox o WHERE o.event_id = NEW.event_id),
                   greatest(coalesce((SELECT max(o.key_seq) FROM pgrelay.outbox o
                                      WHERE o.key = NEW.key AND o.key_seq IS NOT NULL), 0),
                            coalesce(s.seq, 0)) + 1,
                   coalesce(s.xmin = pg_current_xact_id()::xid, false)
            INTO stored, next_seq, mine
            FROM (SELECT 1) AS one
            LEFT JOIN pgrelay.outbox_key_seqs s ON s.key = NEW.key;
            IF NOT stored THEN
                IF NOT mine THEN
                    INSERT INTO pgrelay.outbox_key_seqs AS s (key, seq) VALUES (NEW.key, next_seq)
                    ON CONFLICT (key) DO UPDATE SET seq = greatest(s.seq, excluded.seq);
                END IF;
                NEW.key_seq := next_seq;
            END IF;
        END IF;
    END IF;
    NEW.id := nextval('pgrelay.outbox_id_seq');
    NEW.status := 'pending';
    NEW.partition := pgrelay.outbox_partition(NEW.key);
    -- The row rules (formerly CHECK constraints; one that is NULL passes, as
    -- there), in one expression; outbox_refuse names the rule that failed.
    IF NOT (coalesce(NEW.event_id <> '' AND length(NEW.event_id) <= 255, true)
            AND coalesce(octet_length(NEW.key) <= 1024, true)
            AND coalesce(NEW.occurred_at > '0001-01-01 00:00:00+00'::timestamptz
                         AND NEW.occurred_at < '10000-01-01 00:00:00+00'::timestamptz, true)
            AND coalesce(NEW.topic <> '' AND octet_length(NEW.topic) <= 255
                         AND NEW.topic ~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$', true)
            AND coalesce(octet_length(NEW.traceparent) <= 255 AND octet_length(NEW.tracestate) <= 4096, true)) THEN
        PERFORM pgrelay.outbox_refuse(TG_TABLE_SCHEMA, TG_TABLE_NAME, NEW.event_id, NEW.key, NEW.occurred_at,
                                      NEW.status, NEW.topic, NEW.traceparent, NEW.tracestate);
    END IF;
    RETURN NEW;
END;
$$;
-- +goose StatementEnd
