-- Operator queries: statistics, dead letters (list, show, requeue, purge)
-- and the replay audit trail. The gauges behind /metrics are in metrics.sql,
-- inbox retention in retention.sql.
--
-- The dead-letter filter is written once per table, in AdminListInboxDead and
-- AdminListOutboxDead: every parameter is optional (NULL matches everything).
-- Requeue and purge run the list in their transaction and then act on the
-- rows it returned, by key, each taking the row again only while it is still
-- dead.

-- name: AdminInboxStatusCounts :many
-- AdminInboxStatusCounts counts inbox rows by status (exact; a full scan on a big
-- table, so it is for on-demand statistics, not for every metrics scrape).
SELECT handler, key_strategy, status, pg_catalog.count(*)::bigint AS row_count
FROM pgrelay.inbox
GROUP BY handler, key_strategy, status
ORDER BY handler, key_strategy, status;

-- name: AdminTableSize :one
-- AdminTableSize returns the total size on disk (with indexes and TOAST) of
-- one of pgrelay's tables, named without its schema, or NULL when no such
-- table exists.
SELECT pg_catalog.pg_total_relation_size(pg_catalog.to_regclass('pgrelay.' || @table_name::text))::bigint AS table_bytes;

-- name: AdminListInboxDead :many
SELECT handler, dedup_key, event_id, topic, key, event_type, attempts, received_at, finished_at, last_error
FROM pgrelay.inbox
WHERE status = 'dead'
  AND (sqlc.narg(handler)::text IS NULL OR handler = sqlc.narg(handler)::text)
  AND (sqlc.narg(event_id)::text IS NULL OR event_id = sqlc.narg(event_id)::text)
  AND (sqlc.narg(topic)::text IS NULL OR topic = sqlc.narg(topic)::text)
  AND (sqlc.narg(event_type)::text IS NULL OR event_type = sqlc.narg(event_type)::text)
  AND (sqlc.narg(key)::text IS NULL OR key = sqlc.narg(key)::text)
  AND (sqlc.narg(error_contains)::text IS NULL
       OR pg_catalog.strpos(pg_catalog.lower(coalesce(last_error, '')), pg_catalog.lower(sqlc.narg(error_contains)::text)) > 0)
  AND (sqlc.narg(dead_after)::timestamptz IS NULL OR finished_at >= sqlc.narg(dead_after)::timestamptz)
  AND (sqlc.narg(dead_before)::timestamptz IS NULL OR finished_at < sqlc.narg(dead_before)::timestamptz)
ORDER BY finished_at, event_id, handler
LIMIT @max_rows;

-- name: AdminGetInboxEvent :many
-- AdminGetInboxEvent returns an event's rows: one per handler that stored it
-- (under the handler's dedup key), or only the named handler's.
SELECT * FROM pgrelay.inbox
WHERE event_id = @event_id
  AND (sqlc.narg(handler)::text IS NULL OR handler = sqlc.narg(handler)::text)
ORDER BY handler;

-- name: AdminRequeueInboxDead :many
-- AdminRequeueInboxDead puts the given dead events (by handler and dedup key,
-- from AdminListInboxDead) back to pending, with the same event_id, attempts
-- reset and no lock, and writes one replay_audit row per event in the same
-- statement. A row no longer dead is left alone. lock_version is kept: it only
-- ever grows, so a worker that held the event before it died stays fenced.
WITH picked AS (
    SELECT d.handler, d.dedup_key, d.event_id, d.attempts, d.last_error
    FROM pgrelay.inbox d
    JOIN (SELECT pg_catalog.unnest(@handlers::text[]) AS handler, pg_catalog.unnest(@dedup_keys::text[]) AS dedup_key) k
      ON d.handler = k.handler AND d.dedup_key = k.dedup_key
    WHERE d.status = 'dead'
    FOR UPDATE OF d
), moved AS (
    UPDATE pgrelay.inbox i
    SET status = 'pending', attempts = 0, next_attempt_at = pg_catalog.now(),
        locked_by = NULL, locked_until = NULL, started_at = NULL, finished_at = NULL,
        last_error = NULL, waiting_for = NULL, deferrals = 0
    FROM picked p
    WHERE i.handler = p.handler AND i.dedup_key = p.dedup_key
    RETURNING i.handler, i.event_id, p.attempts AS previous_attempts, p.last_error AS previous_error
)
INSERT INTO pgrelay.replay_audit (source, action, event_id, handler, actor, reason, previous_attempts, previous_error)
SELECT 'inbox', 'requeue', m.event_id, m.handler, @actor::text, @reason::text, m.previous_attempts, m.previous_error
FROM moved m
RETURNING *;

-- name: AdminPurgeInboxDead :many
-- AdminPurgeInboxDead deletes the given dead events (by handler and dedup key,
-- from AdminListInboxDead) and writes one replay_audit row per event in the
-- same statement. A purged event_id no longer deduplicates: a later
-- redelivery of it is received as new.
WITH gone AS (
    DELETE FROM pgrelay.inbox i
    USING (SELECT pg_catalog.unnest(@handlers::text[]) AS handler, pg_catalog.unnest(@dedup_keys::text[]) AS dedup_key) k
    WHERE i.handler = k.handler AND i.dedup_key = k.dedup_key AND i.status = 'dead'
    RETURNING i.handler, i.event_id, i.attempts, i.last_error
)
INSERT INTO pgrelay.replay_audit (source, action, event_id, handler, actor, reason, previous_attempts, previous_error)
SELECT 'inbox', 'purge', g.event_id, g.handler, @actor::text, @reason::text, g.attempts, g.last_error
FROM gone g
RETURNING *;

-- name: AdminListInboxConflicts :many
-- AdminListInboxConflicts lists recorded key conflicts, newest first: a
-- delivery whose dedup key was already stored for its handler with another
-- payload fingerprint (the stored event's effect stands).
SELECT id, detected_at, handler, dedup_key, key_strategy, stored_event_id, event_id,
       stored_fingerprint, fingerprint, topic, event_type, payload
FROM pgrelay.inbox_conflicts
WHERE (sqlc.narg(handler)::text IS NULL OR handler = sqlc.narg(handler)::text)
  AND (sqlc.narg(event_id)::text IS NULL OR event_id = sqlc.narg(event_id)::text
       OR stored_event_id = sqlc.narg(event_id)::text)
ORDER BY id DESC
LIMIT @max_rows;

-- name: AdminNotifyInbox :exec
-- AdminNotifyInbox wakes inbox workers (the channel the inbox insert trigger uses),
-- so requeued events are claimed without waiting for the next poll.
SELECT pg_catalog.pg_notify('pgrelay_inbox', '');

-- name: AdminListReplayAudit :many
SELECT id, at, source, action, event_id, coalesce(handler, '')::text AS handler, actor, reason,
       previous_attempts, previous_error
FROM pgrelay.replay_audit
WHERE (sqlc.narg(event_id)::text IS NULL OR event_id = sqlc.narg(event_id)::text)
  AND (sqlc.narg(source)::text IS NULL OR source = sqlc.narg(source)::text)
ORDER BY id DESC
LIMIT @max_rows;

-- The outbox's dead letters. The filter is the inbox's, on the outbox's
-- columns: the dead time is dead_at (created_at for rows that went dead
-- before dead_at existed).

-- name: AdminOutboxStatusCounts :many
SELECT status, pg_catalog.count(*)::bigint AS row_count
FROM pgrelay.outbox
GROUP BY status
ORDER BY status;

-- name: AdminListOutboxDead :many
SELECT id, event_id, topic, key, event_type, attempts, created_at, partition,
       coalesce(dead_at, created_at)::timestamptz AS dead_at, last_error
FROM pgrelay.outbox
WHERE status = 'dead'
  AND (sqlc.narg(event_id)::text IS NULL OR event_id = sqlc.narg(event_id)::text)
  AND (sqlc.narg(topic)::text IS NULL OR topic = sqlc.narg(topic)::text)
  AND (sqlc.narg(event_type)::text IS NULL OR event_type = sqlc.narg(event_type)::text)
  AND (sqlc.narg(key)::text IS NULL OR key = sqlc.narg(key)::text)
  AND (sqlc.narg(error_contains)::text IS NULL
       OR pg_catalog.strpos(pg_catalog.lower(coalesce(last_error, '')), pg_catalog.lower(sqlc.narg(error_contains)::text)) > 0)
  AND (sqlc.narg(dead_after)::timestamptz IS NULL OR coalesce(dead_at, created_at) >= sqlc.narg(dead_after)::timestamptz)
  AND (sqlc.narg(dead_before)::timestamptz IS NULL OR coalesce(dead_at, created_at) < sqlc.narg(dead_before)::timestamptz)
ORDER BY coalesce(dead_at, created_at), id
LIMIT @max_rows;

-- name: AdminGetOutboxEvent :one
SELECT id, event_id, topic, key, event_type, payload, headers, occurred_at, created_at, status,
       attempts, published_at, dead_at, last_error, partition
FROM pgrelay.outbox WHERE event_id = @event_id;

-- name: AdminRequeueOutboxDead :many
-- AdminRequeueOutboxDead puts the given dead outbox rows (by id, from
-- AdminListOutboxDead) back to pending (same id and event_id, attempts reset)
-- and audits each one, in one statement. A row no longer dead is left alone.
-- The relay publishes them with the broker dedup id they always had.
WITH picked AS (
    SELECT d.id, d.attempts, d.last_error
    FROM pgrelay.outbox d
    WHERE d.id = ANY(@ids::bigint[]) AND d.status = 'dead'
    FOR UPDATE
), moved AS (
    UPDATE pgrelay.outbox o
    SET status = 'pending', attempts = 0, next_attempt_at = NULL, last_error = NULL, dead_at = NULL
    FROM picked p
    WHERE o.id = p.id
    RETURNING o.event_id, p.attempts AS previous_attempts, p.last_error AS previous_error
)
INSERT INTO pgrelay.replay_audit (source, action, event_id, actor, reason, previous_attempts, previous_error)
SELECT 'outbox', 'requeue', m.event_id, @actor::text, @reason::text, m.previous_attempts, m.previous_error
FROM moved m
RETURNING *;

-- name: AdminPurgeOutboxDead :many
-- AdminPurgeOutboxDead deletes the given dead outbox rows (by id, from
-- AdminListOutboxDead) and audits each one, in one statement.
WITH gone AS (
    DELETE FROM pgrelay.outbox o
    WHERE o.id = ANY(@ids::bigint[]) AND o.status = 'dead'
    RETURNING o.event_id, o.attempts, o.last_error
)
INSERT INTO pgrelay.replay_audit (source, action, event_id, actor, reason, previous_attempts, previous_error)
SELECT 'outbox', 'purge', g.event_id, @actor::text, @reason::text, g.attempts, g.last_error
FROM gone g
RETURNING *;

-- name: AdminNotifyOutbox :exec
-- AdminNotifyOutbox wakes the relays for the given partitions, whose
-- requeued rows are pending again below where their claims start the scan:
-- "requeue:" and a comma-separated partition list (the outbox insert
-- trigger's payload is the list alone). A relay that does not know the
-- prefix wakes all its partitions.
SELECT pg_catalog.pg_notify('pgrelay_outbox', 'requeue:' OPERATOR(pg_catalog.||) pg_catalog.array_to_string(@partitions::int[], ','));

-- name: AdminNow :one
-- AdminNow reads the database's clock (the transaction's start time): purge
-- cut-offs are computed from it, as the dead_at and finished_at they are
-- compared with were written by it, whatever the client's clock says.
SELECT pg_catalog.now()::timestamptz AS now;

-- name: AdminOutboxTopics :many
-- AdminOutboxTopics reads the topics of the given outbox rows (by id), to
-- name the ones a requeue refused (constraint outbox_topic_valid).
SELECT event_id, topic FROM pgrelay.outbox WHERE id = ANY(@ids::bigint[]) ORDER BY id;
