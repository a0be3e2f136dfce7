-- +goose Up
-- outbox.topic follows the rule Enqueue applies (internal/outbox validToken):
-- 1 to 255 bytes of parts made of letters, digits, '-' and '_', separated by
-- single dots. A plain-SQL producer's insert of any other topic now fails
-- (SQLSTATE 23514, constraint outbox_topic_valid) instead of being stored:
-- "orders.*" was published to the literal wildcard subject, "a b" went dead
-- at the broker, and a Kafka or RabbitMQ topic outside the rule behaved in
-- yet other ways.
--
-- The table is locked first, in the mode ALTER TABLE needs anyway (no lock
-- upgrade that could deadlock with a reader), so that no row with an invalid
-- topic can be committed between the UPDATE and the constraint; readers and
-- producers wait for this migration, which is short (the UPDATE reads the
-- pending rows, which the partial index outbox_pending_idx holds; the
-- constraint scans nothing). Pending rows
-- stored before with an invalid topic could never be published as meant:
-- they are marked dead here, with the reason, like every row the broker
-- refuses. The constraint is NOT VALID: published and dead rows stored
-- before are not checked (no scan of a possibly large table, and a
-- migration that cannot fail on old data); new rows and updated rows are.
-- A dead row kept from before with an invalid topic therefore cannot be
-- requeued (the update fails on the constraint): it could never be
-- published anyway; purge it.
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE;

UPDATE outbox
   SET status = 'dead',
       last_error = 'topic ' || quote_literal(topic) || ' is invalid: use letters, digits, ''-'', ''_'' and ''.'' between non-empty parts, at most 255 bytes (marked dead by migration 00095)'
 WHERE status = 'pending'
   AND NOT (octet_length(topic) <= 255 AND topic ~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$');

ALTER TABLE outbox ADD CONSTRAINT outbox_topic_valid
    CHECK (octet_length(topic) <= 255 AND topic ~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$') NOT VALID;

-- +goose Down
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
ALTER TABLE outbox DROP CONSTRAINT outbox_topic_valid;
