-- +goose Up
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
-- Per-key sequences for the WAL capture (docs/wal.md#per-key-sequences). The
-- relay reading the slot numbers each keyed event it is about to publish, in
-- commit order, and records the number here, in one statement per publish
-- batch, before publishing: an event read again (after a crash, a takeover,
-- a PostgreSQL restart) finds its number and keeps it. The key's last number
-- is outbox_key_seqs, the counter the table capture uses too, so a key goes
-- on from where it was whichever capture numbered it last.
--
-- lsn is the end of the event's transaction in the WAL (a pg_lsn as a
-- number). A row is deleted once the slot's restart_lsn, the position the
-- server keeps on disk and never moves back, has passed it: the slot never
-- hands that transaction out again. So the table holds about the events read
-- since the last checkpoint or running-transactions record, plus whatever a
-- stopped relay has not confirmed.
CREATE TABLE wal_seq_assignments (
    event_id text   PRIMARY KEY,
    key      text   NOT NULL,
    seq      bigint NOT NULL CHECK (seq > 0),
    lsn      bigint NOT NULL,
    -- Two events of a key never share a number: a fencing mistake fails the
    -- statement loudly instead of publishing a repeated sequence.
    UNIQUE (key, seq)
);
CREATE INDEX wal_seq_assignments_lsn_idx ON wal_seq_assignments (lsn);

-- +goose Down
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
-- The rows are the numbers of events the slot may still hand out; the
-- per-key counters (outbox_key_seqs) stay.
DROP TABLE wal_seq_assignments;
