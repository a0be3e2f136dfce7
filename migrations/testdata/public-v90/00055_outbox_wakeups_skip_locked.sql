-- +goose Up
-- outbox_notify no longer waits for another transaction that is disarming
-- the same partition: it skips a flag row that is locked. Before, two
-- producer transactions inserting into two armed partitions in opposite
-- orders (one statement each at a time) waited for each other, and
-- PostgreSQL aborted one with a deadlock, though their keys had nothing in
-- common. A flag row is locked only by a producer disarming it (whose commit
-- notifies the partition's relay, which then reads again and re-arms after
-- waiting for the transactions running at the arming, this one among them)
-- or by a relay arming it (which waits for this transaction the same way).
-- The one case left to polling: the disarming producer rolls back, so the
-- partition stays armed and nobody notifies for this transaction's rows; the
-- relay finds them at its next poll (PollInterval).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    parts text;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM relay_wakeups WHERE armed) THEN
        RETURN NULL;
    END IF;
    WITH mine AS (
        SELECT w.partition FROM relay_wakeups w
        WHERE w.armed AND w.partition IN (SELECT DISTINCT n.partition FROM new_rows n)
        FOR UPDATE SKIP LOCKED
    ), woken AS (
        UPDATE relay_wakeups w SET armed = false
        FROM mine
        WHERE w.partition = mine.partition AND w.armed
        RETURNING w.partition
    )
    SELECT string_agg(partition::text, ',') INTO parts FROM woken;
    IF parts IS NOT NULL THEN
        PERFORM pg_notify('pgrelay_outbox', parts);
    END IF;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    parts text;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM relay_wakeups WHERE armed) THEN
        RETURN NULL;
    END IF;
    WITH woken AS (
        UPDATE relay_wakeups w SET armed = false
        WHERE w.armed AND w.partition IN (SELECT DISTINCT n.partition FROM new_rows n)
        RETURNING w.partition
    )
    SELECT string_agg(partition::text, ',') INTO parts FROM woken;
    IF parts IS NOT NULL THEN
        PERFORM pg_notify('pgrelay_outbox', parts);
    END IF;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd
