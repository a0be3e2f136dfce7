-- name: EmitWAL :exec
-- Writes each content to the WAL as a transactional logical decoding message
-- with pgrelay's prefix, in order: decoded only if the transaction commits.
SELECT pg_logical_emit_message(true, 'pgrelay', m) FROM unnest(@contents::bytea[]) AS m;

-- name: WALHeartbeat :exec
-- A non-transactional message: WAL in this database, so that a quiet
-- database's slot can confirm past it.
SELECT pg_logical_emit_message(false, 'pgrelay-heartbeat', ''::bytea);

-- name: CreateWALSlot :exec
SELECT pg_create_logical_replication_slot(@slot_name::text, 'pgoutput');
