-- name: EmitWAL :exec
-- Writes each content to the WAL, signed, as a transactional logical
-- decoding message with pgrelay's prefix, in order: decoded only if the
-- transaction commits (migration 00116; the caller needs EXECUTE on it).
SELECT pgrelay.emit_wal(@contents::bytea[]);

-- name: WALKeys :many
-- The keys the WAL capture checks the messages' signatures with.
SELECT id, secret FROM pgrelay.wal_keys;

-- name: WALHeartbeat :exec
-- A non-transactional message: WAL in this database, so that a quiet
-- database's slot can confirm past it.
SELECT pg_catalog.pg_logical_emit_message(false, 'pgrelay-heartbeat', ''::bytea);

-- name: CreateWALSlot :one
-- Returns the new slot's start (its consistent point).
SELECT s.lsn::text FROM pg_catalog.pg_create_logical_replication_slot(@slot_name::text, 'pgoutput') s;

-- name: WALSlotHistory :one
SELECT system_identifier, timeline, confirmed_lsn::text AS confirmed_lsn, confirmed_at
FROM pgrelay.wal_slot_history WHERE slot = @slot::text;

-- name: RecordWALSlotHistory :exec
-- Records the server the slot is on and its confirmed position.
INSERT INTO pgrelay.wal_slot_history (slot, system_identifier, timeline, confirmed_lsn, confirmed_at)
SELECT s.slot_name::text, @system_identifier::text, @timeline::int, s.confirmed_flush_lsn, pg_catalog.now()
FROM pg_catalog.pg_replication_slots s
WHERE s.slot_name = @slot::text AND s.confirmed_flush_lsn IS NOT NULL
ON CONFLICT (slot) DO UPDATE SET system_identifier = excluded.system_identifier, timeline = excluded.timeline,
    confirmed_lsn = excluded.confirmed_lsn, confirmed_at = excluded.confirmed_at;

-- name: OpenWALGap :one
-- The slot's gap no operator accepted yet, if any.
SELECT id, from_lsn::text AS from_lsn, confirmed_at, coalesce(to_lsn::text, '')::text AS to_lsn, cause, detected_at
FROM pgrelay.wal_gaps WHERE slot = @slot::text AND accepted_at IS NULL;

-- name: InsertWALGap :exec
INSERT INTO pgrelay.wal_gaps (slot, from_lsn, confirmed_at, cause)
VALUES (@slot::text, CAST(@from_lsn::text AS pg_lsn), @confirmed_at, @cause::text)
ON CONFLICT (slot) WHERE accepted_at IS NULL DO NOTHING;

-- name: SetWALGapEnd :exec
-- The gap ends where the slot, created past it, starts.
UPDATE pgrelay.wal_gaps g SET to_lsn = s.confirmed_flush_lsn
FROM pg_catalog.pg_replication_slots s
WHERE g.slot = @slot::text AND g.accepted_at IS NULL AND s.slot_name = g.slot;

-- name: AcceptWALGap :one
-- An operator accepts the slot's open gap: the relay streams from the new
-- slot's start.
UPDATE pgrelay.wal_gaps SET accepted_at = pg_catalog.now(), accepted_by = @actor::text, accept_reason = @reason::text
WHERE slot = @slot::text AND accepted_at IS NULL
RETURNING id, from_lsn::text AS from_lsn, confirmed_at, coalesce(to_lsn::text, '')::text AS to_lsn, cause;

-- name: AssignWALKeySeqs :many
-- Numbers the keyed events of one publish batch of the WAL capture, in the
-- order given (commit order), and returns each event's number: the one it
-- was given before when it has one (a re-read), else the key's next. Only
-- the slot's streaming connection (@pid, its walsender) may number: a relay
-- whose connection the server cut (paused, partitioned) numbers nothing and
-- gets no rows. An event id given twice is numbered once. A key's counter is
-- outbox_key_seqs, raised to the key's highest number; the first number of
-- a key also follows the key's highest outbox.key_seq (the table capture's
-- counter row can trail it).
WITH holder AS (
    SELECT 1 AS ok FROM pg_catalog.pg_replication_slots
    WHERE slot_name = @slot_name::text AND active_pid = @pid::int
),
input AS (
    SELECT DISTINCT ON (i.event_id) i.event_id, i.key, i.lsn, i.ord
    -- Set-returning functions in a select list advance in step: ord is
    -- each element's position.
    FROM (SELECT pg_catalog.unnest(@event_ids::text[]) AS event_id, pg_catalog.unnest(@keys::text[]) AS key, pg_catalog.unnest(@lsns::bigint[]) AS lsn,
                 pg_catalog.generate_series(1, pg_catalog.cardinality(@event_ids::text[])) AS ord) i
    WHERE EXISTS (SELECT 1 FROM holder)
    ORDER BY i.event_id, i.ord
),
known AS (
    SELECT a.event_id, a.key, a.seq FROM input i JOIN pgrelay.wal_seq_assignments a ON a.event_id = i.event_id
),
fresh AS (
    SELECT i.event_id, i.key, i.lsn, pg_catalog.row_number() OVER (PARTITION BY i.key ORDER BY i.ord) AS n
    FROM input i WHERE NOT EXISTS (SELECT 1 FROM known k WHERE k.event_id = i.event_id)
),
base AS (
    SELECT f.key, greatest(
        coalesce((SELECT s.seq FROM pgrelay.outbox_key_seqs s WHERE s.key = f.key), 0),
        coalesce((SELECT pg_catalog.max(o.key_seq) FROM pgrelay.outbox o WHERE o.key = f.key AND o.key_seq IS NOT NULL), 0)) AS last
    FROM (SELECT DISTINCT fresh.key FROM fresh) f
),
numbered AS (
    SELECT f.event_id, f.key, b.last + f.n AS seq, f.lsn FROM fresh f JOIN base b ON b.key = f.key
),
assigned AS (
    INSERT INTO pgrelay.wal_seq_assignments (event_id, key, seq, lsn)
    SELECT nb.event_id, nb.key, nb.seq, nb.lsn FROM numbered nb ORDER BY nb.key, nb.seq
    ON CONFLICT (event_id) DO NOTHING
    RETURNING event_id, key, seq
),
counters AS (
    INSERT INTO pgrelay.outbox_key_seqs AS s (key, seq)
    SELECT nb.key, pg_catalog.max(nb.seq) FROM numbered nb GROUP BY nb.key ORDER BY nb.key
    ON CONFLICT (key) DO UPDATE SET seq = greatest(s.seq, excluded.seq)
)
SELECT known.event_id, known.key, known.seq FROM known
UNION ALL
SELECT assigned.event_id, assigned.key, assigned.seq FROM assigned;

-- name: PruneWALKeySeqs :execrows
-- Deletes the numbers of events the slot can no longer hand out: those whose
-- transaction ended before the slot's restart_lsn (kept on disk, never moved
-- back, unlike the confirmed position after a PostgreSQL crash).
DELETE FROM pgrelay.wal_seq_assignments a
WHERE a.lsn < (SELECT pg_catalog.pg_wal_lsn_diff(s.restart_lsn, '0/0')::bigint
               FROM pg_catalog.pg_replication_slots s WHERE s.slot_name = @slot_name::text);
