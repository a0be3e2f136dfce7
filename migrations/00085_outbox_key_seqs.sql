-- +goose Up
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
-- outbox_key_seqs holds the last sequence of each key. It outlives the outbox
-- rows (retention deletes those), so a key never restarts at 1; a producer
-- that rolls back rolls its increment back with it, so sequences stay
-- contiguous. An insert skipped by ON CONFLICT (event_id) DO NOTHING (an
-- idempotent retry) takes no sequence: the trigger checks the event id first.
-- Cost: one upsert of the key's counter row and one event id lookup per
-- keyed insert; one row per distinct key, kept forever.
CREATE TABLE outbox_key_seqs (
    key text   PRIMARY KEY,
    seq bigint NOT NULL CHECK (seq > 0)
);

ALTER TABLE outbox ADD COLUMN key_seq bigint;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_before_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.key_seq := NULL;
    IF NEW.key IS NULL OR NEW.key = '' THEN
        -- No ordering key: the event is ordered with nothing, so no lock.
        NEW.key := NEW.event_id;
    ELSE
        PERFORM pg_advisory_xact_lock(1885434465, hashtext(NEW.key));
        -- A key equal to the event's own id is the default key: no sequence.
        -- An event id already stored is an idempotent retry that the insert
        -- will skip: it must not consume a sequence number.
        IF NEW.key <> NEW.event_id
           AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.event_id = NEW.event_id) THEN
            INSERT INTO outbox_key_seqs AS s (key, seq) VALUES (NEW.key, 1)
            ON CONFLICT (key) DO UPDATE SET seq = s.seq + 1
            RETURNING s.seq INTO NEW.key_seq;
        END IF;
    END IF;
    NEW.id := nextval('outbox_id_seq');
    NEW.status := 'pending';
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

-- +goose Down
-- Rolling back forgets every key's last sequence: re-applied later, keys would
-- restart at 1 and an ordered consumer would absorb the new events as
-- duplicates. It refuses while any sequence was assigned, unless
-- pgrelay.force_down=on.
-- +goose StatementBegin
DO $$
BEGIN
    IF lower(coalesce(current_setting('pgrelay.force_down', true), '')) NOT IN ('on', 'true', 'yes', '1')
       AND EXISTS (SELECT 1 FROM outbox_key_seqs) THEN
        RAISE EXCEPTION 'migrate down: 00085_outbox_key_seqs would drop data: outbox_key_seqs holds the per-key sequences already published; to drop them anyway set pgrelay.force_down=on (relay|consumer migrate down --force, or PGOPTIONS="-c pgrelay.force_down=on" with the goose CLI)'
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
ALTER TABLE outbox DROP COLUMN key_seq;
DROP TABLE outbox_key_seqs;
