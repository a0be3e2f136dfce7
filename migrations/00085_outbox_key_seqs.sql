-- +goose Up
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
-- Per-key sequences: every event with an explicit ordering key gets key_seq,
-- 1, 2, 3, ... per key, contiguous and in commit order, assigned by the
-- outbox_before_insert trigger while it holds the key's enqueue lock (which
-- already serializes a key's producers). The relay publishes it as the
-- Pgrelay-Key-Seq header, so that an ordered consumer applies a key's events
-- strictly in sequence and can tell a missing event from a late one.
--
-- An event without a key takes its event id as key and is ordered with
-- nothing: it gets no sequence (key_seq NULL). A key equal to the event's own
-- id is recognised as that default (the Go outbox writes it so) and gets none
-- either.
--
-- The next sequence of a key is one more than the greater of the key's
-- highest key_seq in the outbox (outbox_key_seq_idx) and its counter row in
-- outbox_key_seqs, read in one statement. The counter is a floor that
-- outlives the rows: a statement trigger raises it to the highest sequence of
-- the rows any DELETE or TRUNCATE removes (retention, purge), so a key never restarts at
-- 1. A transaction writes a key's counter row only with its first row of
-- that key (the row's xmin says whether this transaction wrote it already):
-- bumping one row once per event would grow a chain of row versions that
-- every later event of the same transaction walks, quadratic in the
-- transaction's events of one key. That write is also what makes a REPEATABLE
-- READ or SERIALIZABLE producer that cannot see a concurrent producer's
-- commit of the same key fail with a serialization error (and retry) instead
-- of reusing a sequence. A producer that rolls back takes its rows (and its
-- counter write) with it, so sequences stay contiguous. An insert that
-- ON CONFLICT (event_id) DO NOTHING will skip (an idempotent retry; BEFORE
-- triggers run before the conflict check) takes no sequence: the trigger
-- checks the event id first.
-- Cost per keyed insert: one event id lookup, one index lookup for the
-- key's highest sequence and the counter row, one counter write per key and
-- transaction, and the outbox_key_seq_idx entry. One counter row per distinct
-- key, kept forever.
CREATE TABLE outbox_key_seqs (
    key text   PRIMARY KEY,
    seq bigint NOT NULL CHECK (seq >= 0)
);

ALTER TABLE outbox ADD COLUMN key_seq bigint;
CREATE INDEX outbox_key_seq_idx ON outbox (key, key_seq) WHERE key_seq IS NOT NULL;

-- The function runs with enable_seqscan off: its lookups (the event id, the
-- key's highest number) must stay on their indexes. PL/pgSQL caches a generic
-- plan after a few calls; planned while the outbox was small, or just after an
-- ANALYZE of an empty outbox, it scanned the whole table per row, so one
-- statement inserting 50,000 keyed events took minutes instead of seconds
-- (TestKeySeqLookupsStayOnIndexes).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_before_insert() RETURNS trigger LANGUAGE plpgsql
SET enable_seqscan = off AS $$
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
        -- One statement (one snapshot, one round of the executor per row):
        -- whether the event id is already stored (an idempotent retry the
        -- insert will skip: it must not consume a number), the next number,
        -- and whether this transaction already wrote the key's counter.
        SELECT EXISTS (SELECT 1 FROM outbox o WHERE o.event_id = NEW.event_id),
               greatest(coalesce((SELECT max(o.key_seq) FROM outbox o
                                  WHERE o.key = NEW.key AND o.key_seq IS NOT NULL), 0),
                        coalesce(s.seq, 0)) + 1,
               coalesce(s.xmin = pg_current_xact_id()::xid, false)
        INTO stored, next_seq, mine
        FROM (SELECT 1) AS one
        LEFT JOIN outbox_key_seqs s ON s.key = NEW.key;
        IF NOT stored THEN
            IF NOT mine THEN
                INSERT INTO outbox_key_seqs AS s (key, seq) VALUES (NEW.key, next_seq)
                ON CONFLICT (key) DO UPDATE SET seq = greatest(s.seq, excluded.seq);
            END IF;
            NEW.key_seq := next_seq;
        END IF;
    END IF;
    NEW.id := nextval('outbox_id_seq');
    NEW.status := 'pending';
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- outbox_key_seqs_floor raises each key's counter to the highest sequence of
-- the rows a DELETE removed, so later events of the key continue after it.
CREATE FUNCTION outbox_key_seqs_floor() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO outbox_key_seqs AS s (key, seq)
    SELECT d.key, max(d.key_seq) FROM old_rows d WHERE d.key_seq IS NOT NULL GROUP BY d.key
    ORDER BY d.key
    ON CONFLICT (key) DO UPDATE SET seq = greatest(s.seq, excluded.seq);
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER outbox_key_seqs_floor AFTER DELETE ON outbox
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_key_seqs_floor();

-- +goose StatementBegin
-- outbox_key_seqs_floor_truncate does the same before a TRUNCATE, which
-- fires no DELETE trigger.
CREATE FUNCTION outbox_key_seqs_floor_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO outbox_key_seqs AS s (key, seq)
    SELECT o.key, max(o.key_seq) FROM outbox o WHERE o.key_seq IS NOT NULL GROUP BY o.key
    ORDER BY o.key
    ON CONFLICT (key) DO UPDATE SET seq = greatest(s.seq, excluded.seq);
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER outbox_key_seqs_floor_truncate BEFORE TRUNCATE ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_key_seqs_floor_truncate();

-- +goose Down
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
-- Rolling back forgets every key's last sequence: re-applied later, keys would
-- restart at 1 and an ordered consumer would absorb the new events as
-- duplicates. It refuses while any sequence was assigned (a row's key_seq,
-- or a counter row: since 00090 a READ COMMITTED producer writes only the
-- former), unless pgrelay.force_down=on.
-- +goose StatementBegin
DO $$
BEGIN
    IF lower(coalesce(current_setting('pgrelay.force_down', true), '')) NOT IN ('on', 'true', 'yes', '1')
       AND (EXISTS (SELECT 1 FROM outbox_key_seqs) OR EXISTS (SELECT 1 FROM outbox WHERE key_seq IS NOT NULL)) THEN
        RAISE EXCEPTION 'migrate down: 00085_outbox_key_seqs would drop data: outbox.key_seq and outbox_key_seqs hold the per-key sequences already assigned; to drop them anyway set pgrelay.force_down=on (relay|consumer migrate down --force, or PGOPTIONS="-c pgrelay.force_down=on" with the goose CLI)'
            USING ERRCODE = 'dependent_objects_still_exist';
    END IF;
END $$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_before_insert() RETURNS trigger LANGUAGE plpgsql AS $$
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
DROP TRIGGER outbox_key_seqs_floor_truncate ON outbox;
DROP FUNCTION outbox_key_seqs_floor_truncate();
DROP TRIGGER outbox_key_seqs_floor ON outbox;
DROP FUNCTION outbox_key_seqs_floor();
DROP INDEX outbox_key_seq_idx;
ALTER TABLE outbox DROP COLUMN key_seq;
DROP TABLE outbox_key_seqs;
