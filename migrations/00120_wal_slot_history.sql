-- +goose Up
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
-- The WAL capture's slot history (docs/wal.md#failover). A table, so that it
-- replicates physically to standbys: on a promoted server (where, before
-- PostgreSQL 17, the slot is missing) the relay finds where its slot stood.
-- The streaming relay records, every heartbeat, the server (system
-- identifier from IDENTIFY_SYSTEM, timeline) and the slot's confirmed
-- position.
CREATE TABLE wal_slot_history (
    slot              text        PRIMARY KEY,
    system_identifier text        NOT NULL,
    timeline          integer     NOT NULL,
    confirmed_lsn     pg_lsn      NOT NULL,
    confirmed_at      timestamptz NOT NULL
);

-- A gap: the slot was missing (or on another server) where the history had
-- one, so the events committed after from_lsn and before to_lsn (the new
-- slot's start) were read from no slot. The relay streams the slot only once
-- an operator accepted the gap (relay wal accept-gap).
CREATE TABLE wal_gaps (
    id                bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    slot              text        NOT NULL,
    from_lsn          pg_lsn      NOT NULL,
    confirmed_at      timestamptz NOT NULL,
    to_lsn            pg_lsn,
    cause             text        NOT NULL,
    detected_at       timestamptz NOT NULL DEFAULT now(),
    accepted_at       timestamptz,
    accepted_by       text,
    accept_reason     text
);
CREATE UNIQUE INDEX wal_gaps_open ON wal_gaps (slot) WHERE accepted_at IS NULL;

-- +goose Down
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
DROP TABLE wal_gaps;
DROP TABLE wal_slot_history;
