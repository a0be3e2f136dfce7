-- +goose Up
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
-- occurred_at must lie after 0001-01-01 00:00:00 UTC (Go's zero time, which
-- pgrelay reads as "unset") and before 10000-01-01 00:00:00 UTC (a later time
-- has no RFC 3339 form, the format of the Pgrelay-Occurred-At header). Enqueue
-- refuses the same range with an error naming occurred_at; this constraint
-- holds plain-SQL producers to it (SQLSTATE 23514, constraint
-- outbox_occurred_at_range).
--
-- Rows stored before this migration are not checked (NOT VALID: no scan of the
-- table); the pending ones outside the range could never be consumed, so they
-- are marked dead here, with the reason, before the constraint exists.
UPDATE outbox
   SET status = 'dead',
       last_error = 'occurred_at ' || occurred_at::text || ' is out of range (after 0001-01-01 00:00:00+00, before 10000-01-01 00:00:00+00)'
 WHERE status = 'pending'
   AND NOT (occurred_at > '0001-01-01 00:00:00+00' AND occurred_at < '10000-01-01 00:00:00+00');

ALTER TABLE outbox ADD CONSTRAINT outbox_occurred_at_range
    CHECK (occurred_at > '0001-01-01 00:00:00+00' AND occurred_at < '10000-01-01 00:00:00+00') NOT VALID;

-- +goose Down
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
ALTER TABLE outbox DROP CONSTRAINT outbox_occurred_at_range;
