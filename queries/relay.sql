-- name: PendingBatch :many
-- PendingBatch reads the oldest due pending rows of one partition, in id
-- order. It reads only the outbox_pending_idx partial index,
-- (partition, not_before, id). Rows without a not_before sort apart, in id
-- order: the first branch walks them. Delayed rows (docs/delayed.md) sort by
-- not_before: the second branch reads only those due by now(); a row not due
-- yet is never read.
--
-- Each branch compares the partition with "=": with equality on the index's
-- first column, the bound on its second (IS NULL, <= now()) positions and
-- ends the scan, and the planner costs it so. With the range "partition >= p
-- AND partition <= p" (which kept the planner off the primary key when the
-- claim was ordered by id alone) the second branch walked every delayed row
-- of the partition, and the planner, costing the first branch as a walk of
-- the whole partition, chose a sequential scan when most pending rows were
-- delayed (TestClaimSkipsFarFutureRows: 156 buffers instead of a handful).
-- The primary key cannot tempt the planner here: the first branch is ordered
-- by (partition, not_before, id), which only this index provides, and the
-- second has no order of its own (TestClaimStaysOnPendingIndexWhileDraining).
-- exclude (never NULL; empty for none) skips the previous batch's rows while
-- their mark is still in flight. The first branch starts past @after, the
-- partition's scan floor (relay/floor.go; 0: from the start), so a held
-- xmin horizon's dead entries of published rows are not walked; the rows
-- carry what the floor needs: the snapshot's xmin (the oldest xid still
-- running) and whether a delayed row holds a key (waiting).
--
-- A row whose key has an earlier pending row not due yet is held (per-key
-- order), unless that row expires before it falls due (it can never be
-- published, and ends dead as expired when due): one probe of
-- outbox_delayed_idx (only delayed pending rows) per row, and only when the partition has a row not due yet at all (all of a
-- key's rows share its partition): that test is one probe of
-- outbox_pending_idx, evaluated once per claim, so a partition without
-- waiting rows claims as it did before delayed events (no probe per row). It
-- is ordered by not_before so that the planner reads the index: as "NOT
-- EXISTS" it chose a sequential scan for the first waiting row once many were
-- waiting (361 buffers on a 33,000-row outbox). db_now is the database's clock: the relay measures the time left
-- before a row's expires_at against it, and marks the row dead with the
-- reason 'expired' instead of publishing it once that time has passed,
-- unless sent: a relay handed the row to the broker before (NoteSending).
SELECT b.id, b.event_id, b.topic, b.key, b.event_type, b.payload, b.headers, b.occurred_at, b.created_at, b.key_seq,
       b.expires_at, b.traceparent, b.tracestate, (b.published_at IS NOT NULL)::boolean AS sent, pg_catalog.now()::timestamptz AS db_now,
       pg_catalog.pg_snapshot_xmin(pg_catalog.pg_current_snapshot())::text::bigint AS snapshot_xmin,
       EXISTS (SELECT 1 FROM pgrelay.outbox w
               WHERE w.partition = @partition::int AND w.status = 'pending' AND w.not_before > pg_catalog.now()) AS waiting
FROM (
    (SELECT o.id, o.event_id, o.topic, o.key, o.event_type, o.payload, o.headers, o.occurred_at, o.created_at, o.key_seq, o.expires_at, o.traceparent, o.tracestate, o.published_at
     FROM pgrelay.outbox o
     WHERE o.partition = @partition::int AND o.status = 'pending'
       AND o.not_before IS NULL AND o.id > @after::bigint AND o.id <> ALL(@exclude::bigint[])
       AND ((SELECT w.not_before FROM pgrelay.outbox w
             WHERE w.partition = @partition::int AND w.status = 'pending' AND w.not_before > pg_catalog.now()
             ORDER BY w.not_before LIMIT 1) IS NULL
            OR NOT EXISTS (SELECT 1 FROM pgrelay.outbox h
                           WHERE h.key = o.key AND h.id < o.id AND h.status = 'pending'
                             AND h.not_before IS NOT NULL AND h.not_before > pg_catalog.now()
                             AND (h.expires_at IS NULL OR h.expires_at > h.not_before)))
     ORDER BY o.partition, o.not_before, o.id
     LIMIT @batch_size)
    UNION ALL
    (SELECT o.id, o.event_id, o.topic, o.key, o.event_type, o.payload, o.headers, o.occurred_at, o.created_at, o.key_seq, o.expires_at, o.traceparent, o.tracestate, o.published_at
     FROM pgrelay.outbox o
     WHERE o.partition = @partition::int AND o.status = 'pending'
       AND o.not_before <= pg_catalog.now() AND o.id <> ALL(@exclude::bigint[])
       AND ((SELECT w.not_before FROM pgrelay.outbox w
             WHERE w.partition = @partition::int AND w.status = 'pending' AND w.not_before > pg_catalog.now()
             ORDER BY w.not_before LIMIT 1) IS NULL
            OR NOT EXISTS (SELECT 1 FROM pgrelay.outbox h
                           WHERE h.key = o.key AND h.id < o.id AND h.status = 'pending'
                             AND h.not_before IS NOT NULL AND h.not_before > pg_catalog.now()
                             AND (h.expires_at IS NULL OR h.expires_at > h.not_before))))
) AS b
ORDER BY b.id
LIMIT @batch_size;

-- name: PendingBatchMany :many
-- PendingBatchMany reads, in one statement, what PendingBatch reads for each
-- of @partitions: the LATERAL runs PendingBatch's query for each partition
-- (the same two branches on outbox_pending_idx, the same due, per-key hold
-- and limit rules, so the same plan per partition; TestClaimSkipsFarFutureRows
-- and TestClaimStaysOnPendingIndexWhileDraining check both). It is the
-- relay's poll of its lingering partitions (Relay.pollBusy), which reads only
-- for workers with no mark in flight: there is no exclude list. @afters[i]
-- is @partitions[i]'s scan floor (as PendingBatch's @after). The rows come
-- ordered by partition, then id; db_now and sent are as in PendingBatch.
SELECT t.p::int AS partition, b.id, b.event_id, b.topic, b.key, b.event_type, b.payload, b.headers, b.occurred_at, b.created_at, b.key_seq,
       b.expires_at, b.traceparent, b.tracestate, (b.published_at IS NOT NULL)::boolean AS sent, pg_catalog.now()::timestamptz AS db_now,
       pg_catalog.pg_snapshot_xmin(pg_catalog.pg_current_snapshot())::text::bigint AS snapshot_xmin,
       EXISTS (SELECT 1 FROM pgrelay.outbox w
               WHERE w.partition = p AND w.status = 'pending' AND w.not_before > pg_catalog.now()) AS waiting
FROM (SELECT pg_catalog.unnest(@partitions::int[]) AS p, pg_catalog.unnest(@afters::bigint[]) AS after) AS t
CROSS JOIN LATERAL (
    SELECT c.id, c.event_id, c.topic, c.key, c.event_type, c.payload, c.headers, c.occurred_at, c.created_at, c.key_seq, c.expires_at, c.traceparent, c.tracestate, c.published_at
    FROM (
        (SELECT o.id, o.event_id, o.topic, o.key, o.event_type, o.payload, o.headers, o.occurred_at, o.created_at, o.key_seq, o.expires_at, o.traceparent, o.tracestate, o.published_at
         FROM pgrelay.outbox o
         WHERE o.partition = p AND o.status = 'pending'
           AND o.not_before IS NULL AND o.id > t.after
           AND ((SELECT w.not_before FROM pgrelay.outbox w
                 WHERE w.partition = p AND w.status = 'pending' AND w.not_before > pg_catalog.now()
                 ORDER BY w.not_before LIMIT 1) IS NULL
                OR NOT EXISTS (SELECT 1 FROM pgrelay.outbox h
                               WHERE h.key = o.key AND h.id < o.id AND h.status = 'pending'
                                 AND h.not_before IS NOT NULL AND h.not_before > pg_catalog.now()
                                 AND (h.expires_at IS NULL OR h.expires_at > h.not_before)))
         ORDER BY o.partition, o.not_before, o.id
         LIMIT @batch_size)
        UNION ALL
        (SELECT o.id, o.event_id, o.topic, o.key, o.event_type, o.payload, o.headers, o.occurred_at, o.created_at, o.key_seq, o.expires_at, o.traceparent, o.tracestate, o.published_at
         FROM pgrelay.outbox o
         WHERE o.partition = p AND o.status = 'pending'
           AND o.not_before <= pg_catalog.now()
           AND ((SELECT w.not_before FROM pgrelay.outbox w
                 WHERE w.partition = p AND w.status = 'pending' AND w.not_before > pg_catalog.now()
                 ORDER BY w.not_before LIMIT 1) IS NULL
                OR NOT EXISTS (SELECT 1 FROM pgrelay.outbox h
                               WHERE h.key = o.key AND h.id < o.id AND h.status = 'pending'
                                 AND h.not_before IS NOT NULL AND h.not_before > pg_catalog.now()
                                 AND (h.expires_at IS NULL OR h.expires_at > h.not_before))))
    ) AS c
    ORDER BY c.id
    LIMIT @batch_size
) AS b
ORDER BY 1, b.id;

-- name: NextDue :one
-- NextDue returns how long until the partition's earliest delayed pending row
-- falls due, in microseconds (-1: none waits): one probe of
-- outbox_pending_idx. The relay sleeps until then instead of polling.
SELECT coalesce((extract(epoch FROM pg_catalog.min(o.not_before) - pg_catalog.now()) OPERATOR(pg_catalog.*) 1000000)::bigint, -1)::bigint AS due_in_us
FROM pgrelay.outbox o
WHERE o.partition = @partition::int AND o.status = 'pending' AND o.not_before > pg_catalog.now();

-- name: SweepIdle :many
-- SweepIdle is the poll of the idle partitions, one statement for all of
-- them (Relay.sweepIdle): for each of @partitions, whether its claim would
-- find a row, a pending one without a delay past @afters[i] (its scan floor,
-- as PendingBatch's @after) or a delayed one now due, and, as NextDue, how
-- long until its earliest delayed row falls due, in microseconds (-1: none
-- waits). Three probes of outbox_pending_idx per partition.
SELECT t.p::int AS partition,
       (EXISTS (SELECT 1 FROM pgrelay.outbox o
                WHERE o.partition = t.p AND o.status = 'pending' AND o.not_before IS NULL AND o.id > t.after)
        OR EXISTS (SELECT 1 FROM pgrelay.outbox o
                   WHERE o.partition = t.p AND o.status = 'pending' AND o.not_before <= pg_catalog.now()))::boolean AS ready,
       coalesce((extract(epoch FROM (SELECT pg_catalog.min(o.not_before) FROM pgrelay.outbox o
                                     WHERE o.partition = t.p AND o.status = 'pending' AND o.not_before > pg_catalog.now())
                                    - pg_catalog.now()) OPERATOR(pg_catalog.*) 1000000)::bigint, -1)::bigint AS due_in_us
FROM (SELECT pg_catalog.unnest(@partitions::int[]) AS p, pg_catalog.unnest(@afters::bigint[]) AS after) AS t;

-- name: NoteSending :one
-- NoteSending records on the given pending rows of a partition, those that
-- expire, that a relay is about to hand them to the broker: published_at,
-- NULL on a pending row until then, takes the time (the mark sets it again,
-- or clears it on a row it marks dead). Once noted, a row read again after
-- its expires_at is published again, not marked dead as expired: whether
-- the broker holds it is unknown (a mark lost or fenced after the broker
-- confirmed it, a publish that timed out), and a consumer never applies it
-- after its expiry anyway. Fenced as MarkOutcomesMany: held is false when
-- @owner no longer owns the partition at @epoch, and nothing is noted.
WITH lease AS (
    SELECT rp.partition FROM pgrelay.relay_partitions rp
    WHERE rp.partition = @partition AND rp.owner = @owner::text AND rp.epoch = @epoch
    FOR SHARE
), noted AS (
    UPDATE pgrelay.outbox o
    SET published_at = pg_catalog.now()
    FROM lease
    -- The primary key, not the pending index (as MarkOutcomesMany).
    WHERE o.partition = lease.partition AND o.id = ANY(@ids::bigint[]) AND coalesce(o.status, '') = 'pending'
      AND o.published_at IS NULL
    RETURNING o.id
)
SELECT EXISTS (SELECT 1 FROM lease) AS held;

-- name: MarkOutcomesMany :many
-- MarkOutcomesMany marks the published batches of several partitions in one
-- statement (the relay's marker coalesces the marks its partition workers
-- hand it while a statement is in flight, docs/relay.md "Marks"). @ids are
-- the batches' rows, published but for @dead_ids, which become dead with the
-- reason at the same place in @dead_reasons. Each partition is fenced on its
-- own: the lease CTE locks (FOR SHARE) the lease rows of the pairs
-- (@partitions[i], @epochs[i]) still owned by @owner at that epoch, and only
-- rows of those partitions are updated (every row of a batch is in its
-- partition, and a statement holds at most one mark per partition). A relay
-- that lost a partition marks none of its rows, the other partitions' rows
-- are marked all the same, and a takeover waits for an in-flight mark to
-- commit. The result is the number of rows marked per partition (and the
-- statement's xid, which the scan floor waits for: relay/floor.go); a
-- partition missing from it marked nothing (fenced). The lease rows are
-- locked in partition order, as RenewLeases locks them, so a combined mark
-- and a renewal never deadlock.
--
-- The rows are picked by "id = ANY(@ids)" on the primary key, with no join to
-- the batch: a join of the rows with the unnested batch, planned with the
-- outbox's statistics missing or stale (a new table, autovacuum behind),
-- re-read the batch for every row (500 × 500 comparisons, 60-300 ms a mark)
-- or scanned the partition's whole pending index (118-158 ms a mark of 100
-- at a 50,000-row backlog), and the lease renewals queued behind the lease
-- row it holds. coalesce on the NOT NULL status keeps the pending partial
-- index out of the planner's choices (TestMarkTouchesOnlyItsBatch). The
-- leased partitions are an array computed once, not a join: joined to the
-- lease rows, the rows were scanned once per partition in the statement
-- (with stale statistics a sequential scan of the outbox each time).
--
-- With @async_commit the statement's own transaction commits without waiting
-- for its WAL flush (synchronous_commit off, set for this transaction only,
-- so no session state is left behind for a pooler): a mark lost in a server
-- crash leaves its rows pending, and they are published again, as after a
-- relay crash between publish and mark (docs/relay.md, "Asynchronous marks").
WITH lease AS (
    SELECT rp.partition FROM pgrelay.relay_partitions rp
    WHERE rp.owner = @owner::text
      AND (rp.partition, rp.epoch) IN (SELECT pg_catalog.unnest(@partitions::int[]), pg_catalog.unnest(@epochs::bigint[]))
    ORDER BY rp.partition
    FOR SHARE
), marked AS (
    UPDATE pgrelay.outbox o
    SET status       = CASE WHEN o.id = ANY(@dead_ids::bigint[]) THEN 'dead' ELSE 'published' END,
        published_at = CASE WHEN o.id = ANY(@dead_ids::bigint[]) THEN NULL ELSE pg_catalog.now() END,
        last_error   = (@dead_reasons::text[])[pg_catalog.array_position(@dead_ids::bigint[], o.id)],
        attempts     = o.attempts + 1
    WHERE o.id = ANY(@ids::bigint[]) AND coalesce(o.status, '') = 'pending'
      AND o.partition = ANY(ARRAY(SELECT lease.partition FROM lease))
      AND (SELECT pg_catalog.set_config('synchronous_commit',
            CASE WHEN @async_commit::bool THEN 'off' ELSE pg_catalog.current_setting('synchronous_commit') END, true)) IS NOT NULL
    RETURNING o.partition
)
SELECT m.partition::int AS partition, pg_catalog.count(*)::bigint AS marked,
       pg_catalog.pg_current_xact_id()::text::bigint AS xid
FROM marked m
GROUP BY m.partition;

-- name: RecordPublishFailure :execrows
-- RecordPublishFailure notes a transient failure on the rows of a batch that
-- stay pending, under the same fencing as MarkOutcomesMany.
WITH lease AS (
    SELECT rp.partition FROM pgrelay.relay_partitions rp
    WHERE rp.partition = @partition AND rp.owner = @owner::text AND rp.epoch = @epoch
    FOR SHARE
)
UPDATE pgrelay.outbox o
SET attempts = o.attempts + 1, last_error = @last_error::text, next_attempt_at = @next_attempt_at
FROM lease
-- The primary key, not the pending index (as MarkOutcomesMany).
WHERE o.partition = lease.partition AND o.id = ANY(@ids::bigint[]) AND coalesce(o.status, '') = 'pending';

-- name: HeartbeatNode :exec
-- HeartbeatNode records that the relay is alive. lock_key (NULL: lease only)
-- goes into a new row only: the key of an existing row is RegisterLockKey's,
-- so a heartbeat sent under a session that has just ended never puts its key
-- back.
INSERT INTO pgrelay.relay_nodes (node_id, last_seen, lock_key) VALUES (@node_id, pg_catalog.now(), sqlc.narg(lock_key))
ON CONFLICT (node_id) DO UPDATE SET last_seen = pg_catalog.now();

-- name: RegisterLockKey :execrows
-- RegisterLockKey records the key of the relay's new lock session (already
-- held) in its node row and releases the leases it took under an earlier
-- session, which the relay no longer works; it returns how many it released.
WITH node AS (
    INSERT INTO pgrelay.relay_nodes (node_id, last_seen, lock_key) VALUES (@node_id::text, pg_catalog.now(), @lock_key::bigint)
    ON CONFLICT (node_id) DO UPDATE SET last_seen = pg_catalog.now(), lock_key = EXCLUDED.lock_key
)
UPDATE pgrelay.relay_partitions SET owner = NULL, owner_lock_key = NULL, lease_until = '-infinity'
WHERE owner = @node_id::text AND owner_lock_key IS DISTINCT FROM @lock_key::bigint;

-- name: CountLiveNodes :one
-- CountLiveNodes counts the relays seen within ttl_seconds, except those
-- whose lock session has ended (no session holds their lock key).
SELECT pg_catalog.count(*)::int FROM pgrelay.relay_nodes n
WHERE n.last_seen > pg_catalog.now() - pg_catalog.make_interval(secs => @ttl_seconds::float8)
  AND (n.lock_key IS NULL OR EXISTS (
        SELECT 1 FROM pg_catalog.pg_locks l
        WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
          AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database())
          AND ((l.classid::bigint << 32) | l.objid::bigint) = n.lock_key));

-- name: EndedLockSessions :many
-- EndedLockSessions returns the other relays that own partitions under a
-- lock key no session holds any more: their lock session has ended (the
-- process died, or its connection was closed). A key is held by one session
-- at most and never taken again once released. pg_locks is readable by every
-- role; pg_advisory_lock(bigint) shows its key's high 32 bits as classid,
-- the low ones as objid, with objsubid 1.
SELECT n.node_id, n.lock_key::bigint AS lock_key FROM pgrelay.relay_nodes n
WHERE n.lock_key IS NOT NULL AND n.node_id <> @node_id
  AND EXISTS (SELECT 1 FROM pgrelay.relay_partitions rp WHERE rp.owner = n.node_id AND rp.owner_lock_key = n.lock_key)
  AND NOT EXISTS (
        SELECT 1 FROM pg_catalog.pg_locks l
        WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
          AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database())
          AND ((l.classid::bigint << 32) | l.objid::bigint) = n.lock_key);

-- name: TryLockKey :one
-- TryLockKey takes the session-level advisory lock on key, held until the
-- session ends.
SELECT pg_catalog.pg_try_advisory_lock(@lock_key::bigint) AS locked;

-- name: DeleteNode :exec
DELETE FROM pgrelay.relay_nodes WHERE node_id = @node_id;

-- name: DeleteStaleNodes :exec
DELETE FROM pgrelay.relay_nodes
WHERE last_seen < pg_catalog.now() - pg_catalog.make_interval(secs => @ttl_seconds::float8);

-- name: CountPartitions :one
SELECT pg_catalog.count(*)::int FROM pgrelay.relay_partitions;

-- name: RenewLeases :many
-- RenewLeases extends every lease the relay still owns under its lock session
-- lock_key (NULL: lease only) and returns them; a partition missing from the
-- result was taken over. It locks the lease rows
-- in partition order, as MarkOutcomesMany does: a combined mark holding one
-- lease row while waiting for another never waits on a renewal that holds
-- the second and waits for the first (a deadlock).
WITH mine AS (
    SELECT rp.partition FROM pgrelay.relay_partitions rp
    WHERE rp.owner = @owner::text
    ORDER BY rp.partition
    FOR NO KEY UPDATE
)
UPDATE pgrelay.relay_partitions p
SET lease_until = pg_catalog.now() + pg_catalog.make_interval(secs => @lease_seconds::float8)
FROM mine
WHERE p.partition = mine.partition AND p.owner = @owner::text
  AND p.owner_lock_key IS NOT DISTINCT FROM sqlc.narg(lock_key)::bigint
RETURNING p.partition, p.epoch;

-- name: AcquirePartitions :many
-- AcquirePartitions takes up to max_count free or expired partitions, or
-- partitions held under an ended lock session ((owner, owner_lock_key) among
-- the pairs ended_owners, ended_keys), bumping each one's epoch, and returns
-- the previous owner of each (NULL when free). The lease is held under
-- lock_key (NULL: lease only).
WITH free AS (
    SELECT rp.partition, rp.owner FROM pgrelay.relay_partitions rp
    WHERE rp.owner IS NULL OR rp.lease_until < pg_catalog.now()
       OR (rp.owner, rp.owner_lock_key) IN (SELECT pg_catalog.unnest(@ended_owners::text[]), pg_catalog.unnest(@ended_keys::bigint[]))
    ORDER BY rp.partition
    LIMIT @max_count
    FOR UPDATE SKIP LOCKED
)
UPDATE pgrelay.relay_partitions p
SET owner = @owner::text, owner_lock_key = sqlc.narg(lock_key)::bigint, epoch = p.epoch + 1,
    lease_until = pg_catalog.now() + pg_catalog.make_interval(secs => @lease_seconds::float8), acquired_at = pg_catalog.now()
FROM free
WHERE p.partition = free.partition
RETURNING p.partition, p.epoch, free.owner AS previous_owner;

-- name: NotifyRelays :exec
-- NotifyRelays tells the other relays (on commit) that partitions were
-- released, so that they acquire them at once instead of at their next
-- heartbeat.
SELECT pg_catalog.pg_notify('pgrelay_relays', @payload::text);

-- name: ReleasePartitions :execrows
UPDATE pgrelay.relay_partitions SET owner = NULL, owner_lock_key = NULL, lease_until = '-infinity'
WHERE owner = @owner::text AND partition = ANY(@partitions::int[]);

-- name: DeletePublished :execrows
-- DeletePublished removes up to batch_size published rows older than the
-- retention, oldest first; dead rows are kept for inspection.
DELETE FROM pgrelay.outbox
WHERE id IN (
    SELECT o.id FROM pgrelay.outbox o
    WHERE o.status = 'published'
      AND o.published_at < pg_catalog.now() - pg_catalog.make_interval(secs => @retention_seconds::float8)
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
SELECT coalesce(pg_catalog.array_agg(backend_xid::text), '{}')::text[] AS xids
FROM pg_catalog.pg_stat_activity
WHERE datname = pg_catalog.current_database() AND backend_xid IS NOT NULL AND pid <> pg_catalog.pg_backend_pid();

-- name: CountInProgress :one
-- CountInProgress counts the given transactions still running.
SELECT pg_catalog.count(*)::int FROM pg_catalog.pg_stat_activity
WHERE datname = pg_catalog.current_database() AND backend_xid::text = ANY(@xids::text[]);

-- name: StandbysFlushed :one
-- StandbysFlushed reads a WAL position and how many of the standbys named
-- (application_name) have flushed past it. target NULL: the server's
-- current WAL insert position, which is past the commit record of every row
-- a read before this statement saw; otherwise the position given. Seeing
-- other sessions' LSN columns in pg_stat_replication takes pg_read_all_stats
-- (pg_monitor). flushed_here: this server has flushed past it (a standby is
-- sent only flushed WAL).
SELECT t.lsn::text AS target,
       (SELECT pg_catalog.count(DISTINCT r.application_name)
        FROM pg_catalog.pg_stat_replication r
        WHERE r.application_name OPERATOR(pg_catalog.=) ANY (@names::text[])
          AND r.flush_lsn OPERATOR(pg_catalog.>=) t.lsn)::int AS flushed,
       (pg_catalog.pg_current_wal_flush_lsn() OPERATOR(pg_catalog.>=) t.lsn)::boolean AS flushed_here
FROM (SELECT COALESCE(sqlc.narg('target')::text::pg_catalog.pg_lsn, pg_catalog.pg_current_wal_insert_lsn()) AS lsn) t;

-- name: FlushWAL :exec
-- FlushWAL commits a transaction that wrote WAL (a logical decoding message
-- no capture reads), so its commit flushes every WAL record before it. The
-- WAL writer leaves a partly filled page unflushed until some transaction
-- commits: on a quiet server, a batch's target would wait for the next one.
SELECT pg_catalog.pg_logical_emit_message(true, 'pgrelay.relay.flush', ''),
       pg_catalog.set_config('synchronous_commit', 'on', true);

-- name: StandbyAccess :one
-- StandbyAccess tells whether the role sees pg_stat_replication's LSN
-- columns, and which standbys are connected now.
SELECT pg_catalog.pg_has_role('pg_read_all_stats', 'USAGE') AS can_read,
       COALESCE((SELECT pg_catalog.array_agg(r.application_name ORDER BY r.application_name)
                 FROM pg_catalog.pg_stat_replication r), '{}')::text[] AS connected;
