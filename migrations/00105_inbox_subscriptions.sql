-- +goose Up
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
-- PostgreSQL as the broker (broker/postgres, docs/postgres-broker.md): the
-- relay stores events straight into this database's inbox, one row per
-- handler. inbox_subscriptions names those handlers: a consumer run with
-- --broker postgres (consumer.Config.Direct) writes its targets here at
-- start-up, and the relay's publisher reads them in the transaction of every
-- batch it stores. A row stays when its consumer stops (events keep being
-- stored for it, as a durable subscription keeps them); deleting it
-- unsubscribes the handler.
CREATE TABLE inbox_subscriptions (
    handler            text        PRIMARY KEY CHECK (handler <> '' AND length(handler) <= 63),
    -- The key strategy spec of the handler's rows (inbox.ParseKeyStrategy),
    -- and per-topic overrides: {"topic": "spec"}.
    dedup_key          text        NOT NULL DEFAULT 'message-id',
    dedup_key_by_topic jsonb       NOT NULL DEFAULT '{}'::jsonb CHECK (jsonb_typeof(dedup_key_by_topic) = 'object'),
    -- The topics stored for the handler; NULL: every topic.
    topics             text[],
    updated_at         timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
DROP TABLE inbox_subscriptions;
