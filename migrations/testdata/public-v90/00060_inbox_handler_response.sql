-- +goose Up
-- What a webhook handler's last attempt got back: the HTTP status (NULL when no
-- response arrived: timeout, connection refused) and how long the attempt took.
-- Written by the http handler of cmd/consumer; NULL for every other handler.
ALTER TABLE inbox
    ADD COLUMN handler_status     integer,
    ADD COLUMN handler_latency_ms double precision;

-- +goose Down
-- The recorded responses are diagnostics only; dropping them loses no event.
ALTER TABLE inbox
    DROP COLUMN handler_status,
    DROP COLUMN handler_latency_ms;
