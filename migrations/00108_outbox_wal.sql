-- +goose Up
-- outbox_wal is the outbox table of a relay capturing from the WAL
-- (docs/wal.md#inserting-into-pgrelayoutbox_wal): producers insert events as
-- into the outbox, with the columns of its plain-SQL contract, and the relay
-- reads the inserts from its logical replication slot (the table is in its
-- publication, publish = 'insert'). Nothing reads the rows: they are only the
-- vehicle that puts the event into the WAL, so the table has no trigger, no
-- index, no key and no CHECK (PostgreSQL prepares every CHECK expression for
-- each INSERT statement: the outbox's five cost this table's insert about
-- 0.6x a plain table's, measured), and the relay empties it with TRUNCATE
-- (not replicated: the publication publishes inserts only). The relay checks
-- each event as it reads it (topic rule, lengths, headers) and skips a bad
-- one as dead. not_before is absent on purpose: the WAL cannot hold an event
-- back.
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
CREATE TABLE outbox_wal (
    event_id    text        NOT NULL DEFAULT outbox_uuidv7()::text,
    topic       text        NOT NULL,
    key         text        NOT NULL DEFAULT '',
    event_type  text        NOT NULL DEFAULT '',
    payload     bytea       NOT NULL DEFAULT '\x',
    headers     jsonb       NOT NULL DEFAULT '{}'::jsonb,
    occurred_at timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz,
    traceparent text,
    tracestate  text
);

-- +goose Down
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
DROP TABLE outbox_wal;
