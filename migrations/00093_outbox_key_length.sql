-- +goose Up
-- An ordering key is at most 1024 bytes (event.MaxKeyLen): Enqueue refuses a
-- longer one, and the consumer stores a delivery carrying one dead. Plain-SQL
-- producers get the same limit here, refused at their insert (SQLSTATE 23514,
-- naming the constraint) instead of published and dead-lettered downstream.
-- NOT VALID: rows already stored are not checked (nor rewritten); a longer
-- key among them is published and the consumer stores it dead, saying why.
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
ALTER TABLE outbox ADD CONSTRAINT outbox_key_length CHECK (octet_length(key) <= 1024) NOT VALID;

-- +goose Down
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
ALTER TABLE outbox DROP CONSTRAINT outbox_key_length;
