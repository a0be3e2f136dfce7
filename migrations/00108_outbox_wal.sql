-- +goose Up
-- outbox_wal is the outbox table of a relay capturing from the WAL
-- (docs/wal.md#inserting-into-pgrelayoutbox_wal): producers insert events as
-- into the outbox, with the same columns as its plain-SQL contract, and the
-- relay reads the inserts from its logical replication slot (the table is in
-- its publication, publish = 'insert'). Nothing reads the rows: they are only
-- the vehicle that puts the event into the WAL, so the table has no trigger,
-- no index and no key, and the relay empties it with TRUNCATE (not
-- replicated: the publication publishes inserts only). The CHECKs are the
-- outbox's, cheap per row, so that a bad event fails the producer's insert
-- instead of being skipped by the relay. not_before is absent on purpose: the
-- WAL cannot hold an event back.
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
CREATE TABLE outbox_wal (
    event_id    text        NOT NULL DEFAULT outbox_uuidv7()::text
                CONSTRAINT outbox_wal_event_id_length CHECK (event_id <> '' AND octet_length(event_id) <= 255),
    topic       text        NOT NULL
                CONSTRAINT outbox_wal_topic_valid CHECK (octet_length(topic) <= 255 AND topic ~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$'),
    key         text        NOT NULL DEFAULT ''
                CONSTRAINT outbox_wal_key_length CHECK (octet_length(key) <= 1024),
    event_type  text        NOT NULL DEFAULT '',
    payload     bytea       NOT NULL DEFAULT '\x',
    headers     jsonb       NOT NULL DEFAULT '{}'::jsonb,
    occurred_at timestamptz NOT NULL DEFAULT now()
                CONSTRAINT outbox_wal_occurred_at_range CHECK (occurred_at > '0001-01-01 00:00:00+00' AND occurred_at < '10000-01-01 00:00:00+00'),
    expires_at  timestamptz,
    traceparent text,
    tracestate  text,
    CONSTRAINT outbox_wal_trace_context_length CHECK (octet_length(traceparent) <= 255 AND octet_length(tracestate) <= 4096)
);

-- +goose Down
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
DROP TABLE outbox_wal;
