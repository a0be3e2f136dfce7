-- +goose Up
-- The producer's commit path, made cheaper (measured with pgbench, 8 clients,
-- one INSERT per transaction; docs/benchmarks.md "The producer's commit path").
--
-- 1. outbox.partition is no longer a generated column: the insert trigger
--    computes it. A stored generated column's expression is prepared again
--    for every INSERT statement, and preparing it inlines outbox_partition and
--    outbox_partition_count (their bodies read and planned each time): about a
--    quarter of a one-row producer transaction. The trigger's expression is
--    planned once per session. DROP EXPRESSION keeps the stored values and
--    rewrites nothing. A BEFORE UPDATE trigger keeps the column equal to
--    outbox_partition(key) if anything changes either column.
--
-- 2. A READ COMMITTED producer (the default) no longer writes the key's
--    counter row in outbox_key_seqs, nor checks the event id first. Under the
--    key's enqueue lock each statement of the trigger sees every earlier
--    producer of the key committed, so the highest key_seq in the outbox and
--    the counter (which only DELETE and TRUNCATE raise) give the next number;
--    a number is used only by the row that is stored, so an insert that
--    ON CONFLICT (event_id) DO NOTHING skips, or a rollback, uses none. The
--    counter write and the event id check stay for REPEATABLE READ and
--    SERIALIZABLE producers, whose snapshot may predate a concurrent producer
--    of the same key: writing the counter row is what makes two of them fail
--    with a serialization error instead of reusing a number (00085).
--
-- 3. outbox_key_seq_idx becomes unique: no two events of a key ever carry the
--    same number, whatever the producers' isolation levels. It is what stops
--    a REPEATABLE READ or SERIALIZABLE producer whose snapshot predates a
--    READ COMMITTED producer's commit of the same key (which wrote no counter
--    row): its insert fails on the index with a unique violation (Enqueue
--    returns ErrKeySeqRace) and the transaction is retried.
ALTER TABLE outbox ALTER COLUMN partition DROP EXPRESSION;

DROP INDEX outbox_key_seq_idx;
CREATE UNIQUE INDEX outbox_key_seq_idx ON outbox (key, key_seq) WHERE key_seq IS NOT NULL;

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
        IF current_setting('transaction_isolation') = 'read committed' THEN
            -- A new snapshot, taken after the lock: every earlier producer of
            -- the key is visible.
            SELECT greatest(coalesce((SELECT max(o.key_seq) FROM outbox o
                                      WHERE o.key = NEW.key AND o.key_seq IS NOT NULL), 0),
                            coalesce((SELECT s.seq FROM outbox_key_seqs s WHERE s.key = NEW.key), 0)) + 1
            INTO next_seq;
            NEW.key_seq := next_seq;
        ELSE
            -- One statement (one snapshot): whether the event id is already
            -- stored (an idempotent retry the insert will skip: it must not
            -- write the counter), the next number, and whether this
            -- transaction already wrote the key's counter (00085).
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
    END IF;
    NEW.id := nextval('outbox_id_seq');
    NEW.status := 'pending';
    NEW.partition := outbox_partition(NEW.key);
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- outbox_set_partition keeps partition = outbox_partition(key) when an UPDATE
-- names either column (pgrelay itself never does).
CREATE FUNCTION outbox_set_partition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.partition := outbox_partition(NEW.key);
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER outbox_set_partition BEFORE UPDATE OF key, partition ON outbox
    FOR EACH ROW EXECUTE FUNCTION outbox_set_partition();

-- +goose Down
-- Back to the generated column: the column is dropped and added again
-- (a rewrite of the outbox under an exclusive lock) with its pending index.
DROP INDEX outbox_key_seq_idx;
CREATE INDEX outbox_key_seq_idx ON outbox (key, key_seq) WHERE key_seq IS NOT NULL;
DROP TRIGGER outbox_set_partition ON outbox;
DROP FUNCTION outbox_set_partition();
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
        NEW.key := NEW.event_id;
    ELSIF NEW.key = NEW.event_id THEN
        PERFORM pg_advisory_xact_lock(1885434465, hashtext(NEW.key));
    ELSE
        PERFORM pg_advisory_xact_lock(1885434465, hashtext(NEW.key));
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
DROP INDEX outbox_pending_idx;
ALTER TABLE outbox DROP COLUMN partition;
ALTER TABLE outbox ADD COLUMN partition integer NOT NULL GENERATED ALWAYS AS (outbox_partition(key)) STORED;
CREATE INDEX outbox_pending_idx ON outbox (partition, id) WHERE status = 'pending';
