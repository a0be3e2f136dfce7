-- +goose Up
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
-- Delayed and expiring events (docs/delayed.md).
--
-- not_before: the relay publishes the row at or after this time (compared
-- with the database's now()), never before. NULL: at once. A delayed row
-- holds the later rows of its key until it is published, so per-key order
-- stays true; rows of other keys are not held.
--
-- expires_at: the relay does not publish the row after this time; it marks
-- it dead with the reason 'expired'. It travels to the broker as the
-- Pgrelay-Expires-At header, and the consumer stores an event it would
-- apply after it dead with the reason 'expired'. NULL: never expires.
--
-- Both columns are added without a default: no rewrite of the table.
ALTER TABLE outbox ADD COLUMN not_before timestamptz;
ALTER TABLE outbox ADD COLUMN expires_at timestamptz;

-- outbox_pending_idx gains not_before between the partition and the id. Rows
-- without one (NULL) sort apart, in id order: the claim walks them as before.
-- Delayed rows sort by not_before: the claim reads only those due (not_before
-- <= now()), and the relay finds the partition's next due time in one probe
-- (its wake-up timer). A far-future row is never walked by a claim. The
-- predicate is unchanged, so every count of pending rows still reads it.
DROP INDEX outbox_pending_idx;
CREATE INDEX outbox_pending_idx ON outbox (partition, not_before, id) WHERE status = 'pending';

-- outbox_delayed_idx holds only delayed pending rows, by key: the claim probes
-- it to hold a key's rows behind an earlier row of the key that is not due
-- yet. Without delayed rows it is empty.
CREATE INDEX outbox_delayed_idx ON outbox (key, id) WHERE status = 'pending' AND not_before IS NOT NULL;

-- +goose Down
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
DROP INDEX outbox_delayed_idx;
DROP INDEX outbox_pending_idx;
CREATE INDEX outbox_pending_idx ON outbox (partition, id) WHERE status = 'pending';
ALTER TABLE outbox DROP COLUMN expires_at;
ALTER TABLE outbox DROP COLUMN not_before;
