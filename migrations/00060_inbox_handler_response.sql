-- +goose Up
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
-- What a webhook handler's last attempt got back: the HTTP status (NULL when no
-- response arrived: timeout, connection refused) and how long the attempt took.
-- Written by the http handler of cmd/consumer; NULL for every other handler.
ALTER TABLE inbox
    ADD COLUMN handler_status     integer,
    ADD COLUMN handler_latency_ms double precision;

-- +goose Down
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
-- The recorded responses are diagnostics only; dropping them loses no event.
ALTER TABLE inbox
    DROP COLUMN handler_status,
    DROP COLUMN handler_latency_ms;
