-- +goose Up
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
-- Producers no longer notify on every commit. A NOTIFY takes a lock global to
-- the server at commit, which serialized every producer's commit behind every
-- other's. Now a relay partition worker that found nothing to read arms its
-- partition here; the first insert into an armed partition disarms it and
-- notifies, once, and later inserts find it disarmed and pay nothing but a
-- lookup in this 16-row table. The race (an insert that saw the partition
-- disarmed commits after the worker armed it and looked again) is closed by
-- the worker: see docs/architecture.md, "Wake-ups".
CREATE TABLE relay_wakeups (
    partition integer PRIMARY KEY,
    armed     boolean NOT NULL DEFAULT false
);
INSERT INTO relay_wakeups (partition)
SELECT p FROM generate_series(0, outbox_partition_count() - 1) AS p;

-- +goose StatementBegin
-- outbox_notify disarms the armed partitions among those that got rows and
-- wakes their relays, naming them (a comma-separated list).
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

-- +goose Down
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('pgrelay_outbox', (SELECT string_agg(DISTINCT partition::text, ',') FROM new_rows));
    RETURN NULL;
END;
$$;
-- +goose StatementEnd
DROP TABLE relay_wakeups;
