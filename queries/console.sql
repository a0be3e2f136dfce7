-- Queries of the operator console (relay tui, consumer tui) and of the admin
-- API's dedup report.

-- name: ConsoleRecentDuplicates :many
-- ConsoleRecentDuplicates returns the newest recorded duplicates, newest
-- first, with the age of their original at the time they were refused.
SELECT id, event_id, topic, event_type, handler, original_received_at, seen_at
FROM pgrelay.inbox_duplicates
ORDER BY id DESC
LIMIT @max_rows;

-- name: ConsoleDedupHourly :many
-- ConsoleDedupHourly sums the receive counts of the last @hours hours by hour,
-- oldest first (hours without any message are absent).
SELECT pg_catalog.date_trunc('hour', minute, 'UTC')::timestamptz AS hour,
       pg_catalog.sum(received)::bigint AS received,
       pg_catalog.sum(duplicates)::bigint AS duplicates
FROM pgrelay.inbox_receive_counts
WHERE minute >= pg_catalog.date_trunc('hour', pg_catalog.now(), 'UTC') - pg_catalog.make_interval(hours => @hours::int) + interval '1 hour'
GROUP BY 1
ORDER BY 1;

-- name: ConsoleDuplicateRecordSize :one
-- ConsoleDuplicateRecordSize returns how many duplicates the record holds and
-- its size on disk.
SELECT (SELECT pg_catalog.count(*) FROM pgrelay.inbox_duplicates)::bigint AS row_count,
       pg_catalog.pg_total_relation_size('pgrelay.inbox_duplicates')::bigint AS table_bytes;

-- name: ConsolePruneDuplicates :execrows
-- ConsolePruneDuplicates deletes up to @batch_size of the oldest recorded
-- duplicates beyond the newest @keep.
DELETE FROM pgrelay.inbox_duplicates
WHERE id IN (
    SELECT d.id FROM pgrelay.inbox_duplicates d
    WHERE d.id <= (SELECT pg_catalog.max(id) FROM pgrelay.inbox_duplicates) - @keep::bigint
    ORDER BY d.id
    LIMIT @batch_size
);

-- name: ConsolePruneReceiveCounts :execrows
-- ConsolePruneReceiveCounts deletes up to @batch_size receive counts older
-- than 25 hours.
DELETE FROM pgrelay.inbox_receive_counts
WHERE (minute, backend) IN (
    SELECT c.minute, c.backend FROM pgrelay.inbox_receive_counts c
    WHERE c.minute < pg_catalog.now() - interval '25 hours'
    ORDER BY c.minute
    LIMIT @batch_size
);

-- name: ConsoleResetDedupStats :one
-- ConsoleResetDedupStats empties the duplicate record and the receive counts
-- and records who did it in the replay audit table, in one statement.
WITH d AS (
    DELETE FROM pgrelay.inbox_duplicates RETURNING 1
), c AS (
    DELETE FROM pgrelay.inbox_receive_counts RETURNING 1
)
INSERT INTO pgrelay.replay_audit (source, action, event_id, actor, reason, previous_attempts, previous_error)
SELECT 'inbox', 'reset_dedup_stats', '*', @actor::text, @reason::text, 0,
       (SELECT pg_catalog.count(*) FROM d)::text || ' recorded duplicates and ' || (SELECT pg_catalog.count(*) FROM c)::text || ' minute counts deleted'
RETURNING id, at;

-- name: ConsoleInboxKeys :many
-- ConsoleInboxKeys returns recent inbox events: those not yet processed
-- (pending, processing, dead) newest first, then the most recently processed.
-- With @search, any event whose id contains it (a scan of the inbox: an
-- operator's search, not a hot path). Processed rows carry their retention
-- deadline (finished_at + the dedup window).
SELECT handler, event_id, status, attempts, topic, event_type, received_at, finished_at, last_error
FROM (
    (SELECT handler, event_id, status, attempts, topic, event_type, received_at, finished_at, last_error
     FROM pgrelay.inbox
     WHERE @search::text = '' AND status IN ('pending', 'processing', 'dead')
     ORDER BY received_at DESC
     LIMIT @max_rows)
    UNION ALL
    (SELECT handler, event_id, status, attempts, topic, event_type, received_at, finished_at, last_error
     FROM pgrelay.inbox
     WHERE @search::text = '' AND status = 'processed'
     ORDER BY finished_at DESC
     LIMIT @max_rows)
    UNION ALL
    (SELECT handler, event_id, status, attempts, topic, event_type, received_at, finished_at, last_error
     FROM pgrelay.inbox
     WHERE @search::text <> '' AND pg_catalog.strpos(event_id, @search::text) > 0
     ORDER BY received_at DESC
     LIMIT @max_rows)
) AS k
ORDER BY (status = 'processed'), received_at DESC
LIMIT @max_rows;

-- name: ConsolePartitions :many
-- ConsolePartitions returns each relay partition with its lease and its
-- pending and dead rows (from the partial indexes) and its lag (the age of its
-- oldest pending row).
SELECT p.partition, coalesce(p.owner, '')::text AS owner, p.epoch,
       (p.lease_until > pg_catalog.now())::boolean AS held,
       (CASE WHEN pg_catalog.isfinite(p.lease_until) THEN p.lease_until ELSE 'epoch' END)::timestamptz AS lease_until,
       coalesce(o.pending, 0)::bigint AS pending,
       coalesce(o.dead, 0)::bigint AS dead,
       coalesce(extract(epoch FROM pg_catalog.now() - o.oldest_pending), 0)::float8 AS lag_seconds
FROM pgrelay.relay_partitions p
LEFT JOIN (
    SELECT partition,
           pg_catalog.count(*) FILTER (WHERE status = 'pending') AS pending,
           pg_catalog.count(*) FILTER (WHERE status = 'dead') AS dead,
           pg_catalog.min(created_at) FILTER (WHERE status = 'pending') AS oldest_pending
    FROM pgrelay.outbox
    WHERE status IN ('pending', 'dead')
    GROUP BY partition
) o ON o.partition = p.partition
ORDER BY p.partition;

-- name: ConsoleRelayNodes :many
-- ConsoleRelayNodes lists the relays by heartbeat, with the partitions each
-- holds.
SELECT n.node_id, n.last_seen,
       (n.last_seen > pg_catalog.now() - pg_catalog.make_interval(secs => @ttl_seconds::float8))::boolean AS alive,
       (SELECT pg_catalog.count(*) FROM pgrelay.relay_partitions p WHERE p.owner = n.node_id AND p.lease_until > pg_catalog.now())::int AS partitions
FROM pgrelay.relay_nodes n
ORDER BY n.node_id;

-- name: ConsoleThroughput :many
-- ConsoleThroughput counts, per minute over the last @minutes minutes, the
-- inbox events each handler processed and the outbox rows the relays
-- published (handler '' for the outbox), from the partial indexes on
-- finished_at and published_at. Minutes without any are absent.
SELECT 'inbox'::text AS source, handler, pg_catalog.date_trunc('minute', finished_at)::timestamptz AS minute, pg_catalog.count(*)::bigint AS n
FROM pgrelay.inbox
WHERE status = 'processed' AND finished_at > pg_catalog.now() - pg_catalog.make_interval(mins => @minutes::int)
GROUP BY handler, pg_catalog.date_trunc('minute', finished_at)
UNION ALL
SELECT 'outbox'::text, ''::text, pg_catalog.date_trunc('minute', published_at)::timestamptz, pg_catalog.count(*)::bigint
FROM pgrelay.outbox
WHERE status = 'published' AND published_at > pg_catalog.now() - pg_catalog.make_interval(mins => @minutes::int)
GROUP BY pg_catalog.date_trunc('minute', published_at)
ORDER BY 1, 2, 3;
