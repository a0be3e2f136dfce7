-- +goose Up
-- http_idempotency_keys stores, per Idempotency-Key, the response of the first
-- request that completed with it, written in the same transaction as that
-- request's own writes (package httpidem). A row exists only once the request
-- committed: a request still running holds a transaction-scoped advisory lock
-- on the key instead, so a crash leaves no half-stored row behind.
CREATE TABLE http_idempotency_keys (
    scope        text        NOT NULL DEFAULT '',
    key          text        NOT NULL CHECK (key <> '' AND length(key) <= 255),
    fingerprint  bytea       NOT NULL,
    method       text        NOT NULL,
    path         text        NOT NULL,
    status       integer     NOT NULL,
    headers      jsonb       NOT NULL DEFAULT '{}'::jsonb,
    body         bytea       NOT NULL DEFAULT '\x',
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (scope, key)
);
-- The cleaner deletes expired keys oldest first, in bounded batches.
CREATE INDEX http_idempotency_keys_expires_idx ON http_idempotency_keys (expires_at);

-- guard_keys holds the reservations of the guard for effects outside the
-- database (package guard, PostgreSQL store). A key is 'reserved' by one
-- holder (token) until its lease ends, or 'confirmed' once the effect
-- happened, kept until expires_at so that repeats are refused.
CREATE TABLE guard_keys (
    key         text        PRIMARY KEY CHECK (key <> '' AND length(key) <= 512),
    token       text        NOT NULL,
    state       text        NOT NULL CHECK (state IN ('reserved', 'confirmed')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL
);
CREATE INDEX guard_keys_expires_idx ON guard_keys (expires_at);

-- +goose Down
-- Rolling back refuses while unexpired keys exist (dropping them would let
-- retries repeat their effects): set pgrelay.force_down=on to drop them anyway.
-- +goose StatementBegin
DO $$
BEGIN
    IF lower(coalesce(current_setting('pgrelay.force_down', true), '')) NOT IN ('on', 'true', 'yes', '1')
       AND (EXISTS (SELECT 1 FROM http_idempotency_keys WHERE expires_at > now())
            OR EXISTS (SELECT 1 FROM guard_keys WHERE expires_at > now())) THEN
        RAISE EXCEPTION 'migrate down: 00050_idempotency would drop data: live idempotency keys would be forgotten and their retries run again; to drop them anyway set pgrelay.force_down=on (relay|consumer migrate down --force, or PGOPTIONS="-c pgrelay.force_down=on" with the goose CLI)'
            USING ERRCODE = 'dependent_objects_still_exist';
    END IF;
END $$;
-- +goose StatementEnd
DROP TABLE guard_keys;
DROP TABLE http_idempotency_keys;
