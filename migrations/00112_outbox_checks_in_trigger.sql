-- +goose Up
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
-- The outbox's row rules move from CHECK constraints into the insert trigger.
--
-- PostgreSQL prepares a table's CHECK constraints again for every INSERT or
-- UPDATE statement: each one's stored expression is read back from its text
-- form, planned and compiled before the first row. With seven of them on the
-- outbox that was about a tenth of a one-row producer transaction's backend
-- time (perf, docs/benchmarks.md "The producer's keyed insert, broken
-- down"), more than the row's heap insert. The insert trigger tests all the
-- rules in one expression, planned once per session, and only when it fails
-- calls outbox_refuse to name the rule. The rules are unchanged, checked on
-- the row as stored (after the trigger has defaulted the key), named in the
-- order PostgreSQL checked them (by constraint name), and a refused insert
-- fails as before: SQLSTATE 23514
-- (check_violation), the constraint's name in the error's constraint field
-- and message, the transaction aborted.
--
-- An UPDATE is checked by outbox_valid_update, a row trigger whose WHEN
-- clause (evaluated without calling it) lets through what the relay and the
-- retention do (status to published or dead, attempts, errors, times): it
-- runs only when an update changes one of the checked columns, sets a status
-- outside pending|published|dead, or puts a row back to pending (a requeue),
-- so a dead row stored before a rule with a value the rule refuses still
-- cannot be requeued (the requeue fails naming the rule, as before). Unlike
-- the constraints, an update that only marks such an old row published or
-- dead is no longer refused.
--
-- Rows already stored are not checked again (the constraints were NOT VALID
-- or already held).
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

-- +goose StatementBegin
-- outbox_refuse raises check_violation naming the first row rule that the
-- values break (in constraint-name order, as PostgreSQL checked them), and
-- returns if they break none.
CREATE FUNCTION outbox_refuse(tbl_schema text, tbl text, event_id text, key text, occurred_at timestamptz,
                              status text, topic text, traceparent text, tracestate text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF NOT (event_id <> '' AND length(event_id) <= 255) THEN
        RAISE EXCEPTION 'new row for relation "%" violates check constraint "%"', tbl, 'outbox_event_id_check'
            USING ERRCODE = 'check_violation', CONSTRAINT = 'outbox_event_id_check', TABLE = tbl, SCHEMA = tbl_schema,
                  DETAIL = 'The event id must be 1 to 255 characters.';
    END IF;
    IF NOT (octet_length(key) <= 1024) THEN
        RAISE EXCEPTION 'new row for relation "%" violates check constraint "%"', tbl, 'outbox_key_length'
            USING ERRCODE = 'check_violation', CONSTRAINT = 'outbox_key_length', TABLE = tbl, SCHEMA = tbl_schema,
                  DETAIL = 'The key must be at most 1024 bytes.';
    END IF;
    IF NOT (occurred_at > '0001-01-01 00:00:00+00'::timestamptz AND occurred_at < '10000-01-01 00:00:00+00'::timestamptz) THEN
        RAISE EXCEPTION 'new row for relation "%" violates check constraint "%"', tbl, 'outbox_occurred_at_range'
            USING ERRCODE = 'check_violation', CONSTRAINT = 'outbox_occurred_at_range', TABLE = tbl, SCHEMA = tbl_schema,
                  DETAIL = 'occurred_at must lie after 0001-01-01 00:00:00+00 and before 10000-01-01 00:00:00+00.';
    END IF;
    IF NOT (status IN ('pending', 'published', 'dead')) THEN
        RAISE EXCEPTION 'new row for relation "%" violates check constraint "%"', tbl, 'outbox_status_check'
            USING ERRCODE = 'check_violation', CONSTRAINT = 'outbox_status_check', TABLE = tbl, SCHEMA = tbl_schema,
                  DETAIL = 'The status must be pending, published or dead.';
    END IF;
    IF NOT (topic <> '') THEN
        RAISE EXCEPTION 'new row for relation "%" violates check constraint "%"', tbl, 'outbox_topic_check'
            USING ERRCODE = 'check_violation', CONSTRAINT = 'outbox_topic_check', TABLE = tbl, SCHEMA = tbl_schema,
                  DETAIL = 'The topic must not be empty.';
    END IF;
    IF NOT (octet_length(topic) <= 255 AND topic ~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$') THEN
        RAISE EXCEPTION 'new row for relation "%" violates check constraint "%"', tbl, 'outbox_topic_valid'
            USING ERRCODE = 'check_violation', CONSTRAINT = 'outbox_topic_valid', TABLE = tbl, SCHEMA = tbl_schema,
                  DETAIL = 'The topic must be letters, digits, ''-'', ''_'' and ''.'' between non-empty parts, at most 255 bytes.';
    END IF;
    IF NOT (octet_length(traceparent) <= 255 AND octet_length(tracestate) <= 4096) THEN
        RAISE EXCEPTION 'new row for relation "%" violates check constraint "%"', tbl, 'outbox_trace_context_length'
            USING ERRCODE = 'check_violation', CONSTRAINT = 'outbox_trace_context_length', TABLE = tbl, SCHEMA = tbl_schema,
                  DETAIL = 'traceparent must be at most 255 bytes and tracestate at most 4096.';
    END IF;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- outbox_check_update applies the row rules to an updated row that
-- outbox_valid_update's WHEN clause lets through.
CREATE FUNCTION outbox_check_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgrelay.outbox_refuse(TG_TABLE_SCHEMA, TG_TABLE_NAME, NEW.event_id, NEW.key, NEW.occurred_at,
                                  NEW.status, NEW.topic, NEW.traceparent, NEW.tracestate);
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

-- Named to run after the other BEFORE UPDATE triggers (alphabetical), on the
-- row as it will be stored.
CREATE TRIGGER outbox_valid_update BEFORE UPDATE ON outbox
    FOR EACH ROW
    WHEN (NEW.event_id IS DISTINCT FROM OLD.event_id
          OR NEW.topic IS DISTINCT FROM OLD.topic
          OR NEW.key IS DISTINCT FROM OLD.key
          OR NEW.occurred_at IS DISTINCT FROM OLD.occurred_at
          OR NEW.traceparent IS DISTINCT FROM OLD.traceparent
          OR NEW.tracestate IS DISTINCT FROM OLD.tracestate
          OR (NEW.status <> OLD.status AND NEW.status NOT IN ('published', 'dead')))
    EXECUTE FUNCTION outbox_check_update();

ALTER TABLE outbox
    DROP CONSTRAINT outbox_event_id_check,
    DROP CONSTRAINT outbox_key_length,
    DROP CONSTRAINT outbox_occurred_at_range,
    DROP CONSTRAINT outbox_status_check,
    DROP CONSTRAINT outbox_topic_check,
    DROP CONSTRAINT outbox_topic_valid,
    DROP CONSTRAINT outbox_trace_context_length;

-- +goose Down
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
-- The constraints come back as they were: the three that held for every row
-- are validated again (a scan of the outbox: every row inserted or updated
-- meanwhile passed the same rules), the others NOT VALID.
ALTER TABLE outbox
    ADD CONSTRAINT outbox_event_id_check CHECK (event_id <> '' AND length(event_id) <= 255),
    ADD CONSTRAINT outbox_topic_check CHECK (topic <> ''),
    ADD CONSTRAINT outbox_status_check CHECK (status IN ('pending', 'published', 'dead'));
ALTER TABLE outbox ADD CONSTRAINT outbox_key_length CHECK (octet_length(key) <= 1024) NOT VALID;
ALTER TABLE outbox ADD CONSTRAINT outbox_occurred_at_range
    CHECK (occurred_at > '0001-01-01 00:00:00+00' AND occurred_at < '10000-01-01 00:00:00+00') NOT VALID;
ALTER TABLE outbox ADD CONSTRAINT outbox_topic_valid
    CHECK (octet_length(topic) <= 255 AND topic ~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$') NOT VALID;
ALTER TABLE outbox ADD CONSTRAINT outbox_trace_context_length
    CHECK (octet_length(traceparent) <= 255 AND octet_length(tracestate) <= 4096) NOT VALID;
DROP TRIGGER outbox_valid_update ON outbox;
DROP FUNCTION outbox_check_update();
DROP FUNCTION outbox_refuse(text, text, text, text, timestamptz, text, text, text, text);
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
    RETURN NEW;
END;
$$;
-- +goose StatementEnd
