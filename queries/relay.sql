-- name: PendingBatch :many
-- PendingBatch reads the oldest pending rows of one partition, in id order.
-- It reads only the outbox_pending_idx partial index. The partition is
-- compared as a range and sorted on, on purpose: with "partition = $1" the
-- planner may walk the primary key in id order instead, filtering out every
-- published row on the way, once statistics taken during a large backlog say
-- most rows are pending (74 ms instead of 0.1 ms per read at half of a
-- 400,000-row backlog). No other index provides (partition, id) order.
-- exclude (never NULL; empty for none) skips the previous batch's rows while
-- their mark is still in flight.
SELECT id, event_id, topic, key, event_type, payload, headers, occurred_at, created_at, key_seq, traceparent, tracestate
FROM pgrelay.outbox
WHERE partition >= @partition::int AND partition <= @partition::int AND status = 'pending'
  AND id <> ALL(@exclude::bigint[])
ORDER BY partition, id
LIMIT @batch_size;

-- name: MarkOutcomes :execrows
-- MarkOutcomes marks a published batch in one statement: @ids are the batch's
-- rows, published but for @dead_ids, which become dead with the reason at the
-- same place in @dead_reasons. The lease CTE locks the partition's lease row
-- (FOR SHARE) and requires the caller's owner and epoch, so a relay that lost
-- the partition marks nothing, and a takeover waits for an in-flight mark to
-- commit.
--
-- The rows are picked by "id = ANY(@ids)" on the primary key, with no join to
-- the batch: a join of the rows with the unnested batch, planned with the
-- outbox's statistics missing or stale (a new table, autovacuum behind),
-- re-read the batch for every row (500 × 500 comparisons, 60-300 ms a mark)
-- or scanned the partition's whole pending index (118-158 ms a mark of 100
-- at a 50,000-row backlog), and the lease renewals queued behind the lease
-- row it holds. coalesce on the NOT NULL status keeps the pending partial
-- index out of the planner's choices (TestMarkTouchesOnlyItsBatch).
WITH lease AS (
    SELECT rp.partition FROM pgrelay.relay_partitions rp
    WHERE rp.partition = @partition AND rp.owner = @owner::text AND rp.epoch = @epoch
    FOR SHARE
)
UPDATE pgrelay.outbox o
SET status       = CASE WHEN o.id = ANY(@dead_ids::bigint[]) THEN 'dead' ELSE 'published' END,
    published_at = CASE WHEN o.id = ANY(@dead_ids::bigint[]) THEN NULL ELSE now() END,
    last_error   = (@dead_reasons::text[])[array_position(@dead_ids::bigint[], o.id)],
    attempts     = o.attempts + 1
FROM lease
WHERE o.partition = lease.partition AND o.id = ANY(@ids::bigint[]) AND coalesce(o.status, '') = 'pending';

-- name: RecordPublishFailure :execrows
-- RecordPublishFailure notes a transient failure on the rows of a batch that
-- stay pending, under the same fencing as MarkOutcomes.
WITH lease AS (
    SELECT rp.partition FROM pgrelay.relay_partitions rp
    WHERE rp.partition = @partition AND rp.owner = @owner::text AND rp.epoch = @epoch
    FOR SHARE
)
UPDATE pgrelay.outbox o
SET attempts = o.attempts + 1, last_error = @last_error::text, next_attempt_at = @next_attempt_at
FROM lease
-- The primary key, not the pending index (as MarkOutcomes).
WHERE o.partition = lease.partition AND o.id = ANY(@ids::bigint[]) AND coalesce(o.status, '') = 'pending';

-- name: HeartbeatNode :exec
INSERT INTO pgrelay.relay_nodes (node_id, last_seen) VALUES (@node_id, now())
ON CONFLICT (node_id) DO UPDATE SET last_seen = now();

-- name: CountLiveNodes :one
SELECT count(*)::int FROM pgrelay.relay_nodes
WHERE last_seen > now() - make_interval(secs => @ttl_seconds::float8);

-- name: DeleteNode :exec
DELETE FROM pgrelay.relay_nodes WHERE node_id = @node_id;

-- name: DeleteStaleNodes :exec
DELETE FROM pgrelay.relay_nodes
WHERE last_seen < now() - make_interval(secs => @ttl_seconds::float8);

-- name: CountPartitions :one
SELECT count(*)::int FROM pgrelay.relay_partitions;

-- name: RenewLeases :many
-- RenewLeases extends every lease the relay still owns and returns them; a
-- partition missing from the result was taken over.
UPDATE pgrelay.relay_partitions
SET lease_until = now() + make_interval(secs => @lease_seconds::float8)
WHERE owner = @owner::text
RETURNING partition, epoch;

-- name: AcquirePartitions :many
-- AcquirePartitions takes up to max_count free or expired partitions, bumping
-- each one's epoch, and returns the previous owner of each (NULL when free).
WITH free AS (
    SELECT rp.partition, rp.owner FROM pgrelay.relay_partitions rp
    WHERE rp.owner IS NULL OR rp.lease_until < now()
    ORDER BY rp.partition
    LIMIT @max_count
    FOR UPDATE SKIP LOCKED
)
UPDATE pgrelay.relay_partitions p
SET owner = @owner::text, epoch = p.epoch + 1,
    lease_until = now() + make_interval(secs => @lease_seconds::float8), acquired_at = now()
FROM free
WHERE p.partition = free.partition
RETURNING p.partition, p.epoch, free.owner AS previous_owner;

-- name: NotifyRelays :exec
-- NotifyRelays tells the other relays (on commit) that partitions were
-- released, so that they acquire them at once instead of at their next
-- heartbeat.
SELECT pg_notify('pgrelay_relays', @payload::text);

-- name: ReleasePartitions :execrows
UPDATE pgrelay.relay_partitions SET owner = NULL, lease_until = '-infinity'
WHERE owner = @owner::text AND partition = ANY(@partitions::int[]);

-- name: DeletePublished :execrows
-- DeletePublished removes up to batch_size published rows older than the
-- retention, oldest first; dead rows are kept for inspection.
DELETE FROM pgrelay.outbox
WHERE id IN (
    SELECT o.id FROM pgrelay.outbox o
    WHERE o.status = 'published'
      AND o.published_at < now() - make_interval(secs => @retention_seconds::float8)
    ORDER BY o.published_at
    LIMIT @batch_size
    FOR UPDATE SKIP LOCKED
);

-- name: ArmWakeup :exec
-- ArmWakeup asks the outbox insert trigger to notify the next insert into
-- the partition (once: the trigger disarms it).
UPDATE pgrelay.relay_wakeups SET armed = true WHERE partition = @partition AND NOT armed;

-- name: InProgressXids :one
-- InProgressXids lists the transactions of this database that have written
-- something and are still running (their rows could have missed an arming
-- that just committed). Transactions of other databases cannot insert here.
SELECT coalesce(array_agg(backend_xid::text), '{}')::text[] AS xids
FROM pg_catalog.pg_stat_activity
WHERE datname = current_database() AND backend_xid IS NOT NULL AND pid <> pg_backend_pid();

-- name: CountInProgress :one
-- CountInProgress counts the given transactions still running.
SELECT count(*)::int FROM pg_catalog.pg_stat_activity
WHERE datname = current_database() AND backend_xid::text = ANY(@xids::text[]);

-- name: PendingPartitions :many
-- PendingPartitions returns which of @partitions hold a pending row: one
-- probe of outbox_pending_idx each (the first entry in PendingBatch's order),
-- for the relay's poll of partitions that are busy (Relay.pollBusy).
SELECT p::int AS partition
FROM unnest(@partitions::int[]) AS p
CROSS JOIN LATERAL (
    SELECT o.id FROM pgrelay.outbox o
    WHERE o.partition >= p AND o.partition <= p AND o.status = 'pending'
    ORDER BY o.partition, o.id
    LIMIT 1
) AS first;
