-- name: ChaosOutboxEvents :many
-- ChaosOutboxEvents lists every outbox row in id order for the fault-test
-- checker: the produced events and their per-key commit order.
-- not_before, expires_at and published_at check delayed and expiring events.
SELECT id, event_id, key, event_type, status, last_error, not_before, expires_at, published_at
FROM pgrelay.outbox
ORDER BY id;

-- name: ChaosInboxEvents :many
-- ChaosInboxEvents lists every inbox row's outcome for the fault-test checker.
-- expires_at is the event's expiry (kept in the headers; '' for none), finished_at when
-- its outcome was recorded (the applying transaction's now()).
SELECT event_id, event_type, status, attempts, last_error,
       (status = 'processing' AND locked_until < pg_catalog.now())::boolean AS lease_expired,
       coalesce(headers->>'Pgrelay-Expires-At', '')::text AS expires_at, finished_at
FROM pgrelay.inbox;

-- name: ChaosLedgerEntries :many
-- ChaosLedgerEntries lists every ledger credit for the fault-test checker.
SELECT event_id, order_id, amount_cents FROM ledger_entries;

-- name: ChaosLedgerOrders :many
-- ChaosLedgerOrders lists every order the ledger knows, with the event that
-- created it, for the fault-test checker.
SELECT event_id, order_id FROM ledger_orders;

-- name: ChaosProgress :one
-- ChaosProgress counts what is still in flight: outbox rows not published or
-- dead, outbox rows that are to reach the inbox (all but those that expired
-- unpublished), inbox rows, and inbox rows pending or processing.
SELECT (SELECT pg_catalog.count(*) FROM pgrelay.outbox WHERE status = 'pending')::bigint AS outbox_pending,
       -- Rows that expired unpublished never reach the inbox.
       (SELECT pg_catalog.count(*) FROM pgrelay.outbox WHERE NOT (status = 'dead' AND last_error = 'expired'))::bigint AS outbox_total,
       (SELECT pg_catalog.count(*) FROM pgrelay.inbox)::bigint AS inbox_total,
       (SELECT pg_catalog.count(*) FROM pgrelay.inbox WHERE status IN ('pending', 'processing'))::bigint AS inbox_open;

-- name: ChaosInboxOrder :many
-- ChaosInboxOrder lists the inbox rows that carry a per-key sequence, by
-- handler, key and sequence, with when each was applied: the fault-test
-- checker's per-key apply order of an ordered handler.
SELECT handler, key, key_seq::bigint AS key_seq, event_id, status, finished_at
FROM pgrelay.inbox
WHERE key_seq IS NOT NULL
ORDER BY handler, key, key_seq, finished_at;

-- name: ChaosInsertOutboxWAL :exec
-- ChaosInsertOutboxWAL writes an event of the fault test's WAL capture run as a
-- plain-SQL producer does: a row of pgrelay.outbox_wal, which the relay reads
-- from its slot's inserts.
INSERT INTO pgrelay.outbox_wal (event_id, topic, key, event_type, payload, headers, occurred_at)
VALUES (sqlc.arg(event_id), sqlc.arg(topic), sqlc.arg(key), sqlc.arg(event_type), sqlc.arg(payload), sqlc.arg(headers), pg_catalog.now());
