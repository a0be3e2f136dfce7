-- name: InsertInbox :many
-- InsertInbox stores a batch of received messages in one statement: one row
-- per message and handler, keyed by (handler, dedup_key), with the payload's
-- fingerprint. Rows whose key is already stored for their handler are
-- skipped; the returned keys are the rows actually inserted, and only the
-- others need comparing with what is stored (InboxStoredKeys). A non-empty
-- dead reason stores the row directly as dead.
-- A non-empty @apply_handler stores that handler's live rows directly as
-- processed, as MarkInboxBatchProcessed would leave them after one attempt
-- (attempts 1, lock_version 1, locked_by @worker_id, started_at
-- @started_at): the caller applies them in this same transaction, after a
-- savepoint taken just before, and rolls back to it when the handler fails
-- (Worker.ReceiveApply). The rows are returned with what a claim returns, the
-- payload and headers only for those processed rows.
-- With @record_duplicates, the same statement also records every skipped row
-- (and every row of @repeated_*, a key repeated within the batch and not sent
-- as a row) in inbox_duplicates, and adds the batch to this session's
-- inbox_receive_counts row of the minute.
WITH m AS (
    -- Set-returning functions in one select list advance in lockstep: row k
    -- takes element k of every array.
    SELECT pg_catalog.unnest(@handlers::text[]) AS handler,
           pg_catalog.unnest(@dedup_keys::text[]) AS dedup_key,
           pg_catalog.unnest(@key_strategies::text[]) AS key_strategy,
           pg_catalog.unnest(@fingerprints::bytea[]) AS fingerprint,
           pg_catalog.unnest(@event_ids::text[]) AS event_id,
           pg_catalog.unnest(@topics::text[]) AS topic,
           pg_catalog.unnest(@keys::text[]) AS key,
           pg_catalog.unnest(@event_types::text[]) AS event_type,
           pg_catalog.unnest(@payloads::bytea[]) AS payload,
           pg_catalog.unnest(@headers::jsonb[]) AS headers,
           pg_catalog.unnest(@occurred_ats::timestamptz[]) AS occurred_at,
           pg_catalog.unnest(@dead_reasons::text[]) AS dead_reason,
           pg_catalog.unnest(@key_seqs::bigint[]) AS key_seq
), ins AS (
    INSERT INTO pgrelay.inbox (handler, dedup_key, key_strategy, fingerprint, event_id, topic, key, event_type, payload,
                       headers, occurred_at, status, last_error, finished_at, key_seq,
                       attempts, lock_version, locked_by, started_at)
    SELECT m.handler, m.dedup_key, m.key_strategy, m.fingerprint, m.event_id, m.topic, m.key, m.event_type,
           m.payload, m.headers, m.occurred_at,
           CASE WHEN m.dead_reason <> '' THEN 'dead' WHEN m.applied THEN 'processed' ELSE 'pending' END,
           NULLIF(m.dead_reason, ''),
           CASE WHEN m.dead_reason <> '' OR m.applied THEN pg_catalog.now() END,
           NULLIF(m.key_seq, 0),
           CASE WHEN m.applied THEN 1 ELSE 0 END,
           CASE WHEN m.applied THEN 1 ELSE 0 END,
           CASE WHEN m.applied THEN @worker_id::text END,
           CASE WHEN m.applied THEN @started_at::timestamptz END
    FROM (SELECT m.*, m.dead_reason = '' AND m.handler = @apply_handler::text AS applied FROM m) AS m
    ON CONFLICT (handler, dedup_key) DO NOTHING
    RETURNING handler, dedup_key, event_id, topic, key, event_type, status, occurred_at, received_at,
              attempts, deferrals, lock_version, last_error, key_seq,
              (CASE WHEN status = 'processed' THEN payload END)::bytea AS applied_payload,
              (CASE WHEN status = 'processed' THEN headers END)::jsonb AS applied_headers
), rep AS (
    SELECT pg_catalog.unnest(@repeated_handlers::text[]) AS handler,
           pg_catalog.unnest(@repeated_dedup_keys::text[]) AS dedup_key,
           pg_catalog.unnest(@repeated_event_ids::text[]) AS event_id
), dup AS (
    INSERT INTO pgrelay.inbox_duplicates (event_id, topic, event_type, handler, original_received_at)
    SELECT d.event_id, d.topic, d.event_type, d.handler, d.original_received_at
    FROM (
        SELECT m.event_id, m.topic, m.event_type, m.handler, i.received_at AS original_received_at
        FROM m
        -- The original as this statement's snapshot sees it: committed
        -- before the statement began.
        LEFT JOIN pgrelay.inbox i ON i.handler = m.handler AND i.dedup_key = m.dedup_key
        WHERE NOT EXISTS (SELECT 1 FROM ins WHERE ins.handler = m.handler AND ins.dedup_key = m.dedup_key)
        UNION ALL
        SELECT r.event_id, m.topic, m.event_type, r.handler, i.received_at
        FROM rep r
        JOIN m ON m.handler = r.handler AND m.dedup_key = r.dedup_key
        LEFT JOIN pgrelay.inbox i ON i.handler = r.handler AND i.dedup_key = r.dedup_key
    ) AS d
    WHERE @record_duplicates::boolean
), counts AS (
    INSERT INTO pgrelay.inbox_receive_counts AS c (minute, backend, received, duplicates)
    SELECT pg_catalog.date_trunc('minute', pg_catalog.now()), pg_catalog.pg_backend_pid(),
           (SELECT pg_catalog.count(*) FROM m) + (SELECT pg_catalog.count(*) FROM rep),
           (SELECT pg_catalog.count(*) FROM m) - (SELECT pg_catalog.count(*) FROM ins) + (SELECT pg_catalog.count(*) FROM rep)
    WHERE @record_duplicates::boolean
    ON CONFLICT (minute, backend) DO UPDATE
    SET received = c.received + excluded.received,
        duplicates = c.duplicates + excluded.duplicates
)
SELECT handler, dedup_key, event_id, topic, key, event_type, status, occurred_at, received_at,
       attempts, deferrals, lock_version, last_error, key_seq, applied_payload, applied_headers
FROM ins;

-- name: InboxStoredKeys :many
-- InboxStoredKeys reads the stored event id, fingerprint, key and key
-- sequence of the given (handler, dedup_key) pairs: the rows InsertInbox did
-- not insert, whose fingerprint tells a redelivery from a conflict, and whose
-- key sequence tells a redelivery from another sequence absorbed by them.
SELECT i.handler, i.dedup_key, i.event_id, i.fingerprint, i.key, i.key_seq
FROM pgrelay.inbox i
JOIN (SELECT pg_catalog.unnest(@handlers::text[]) AS handler, pg_catalog.unnest(@dedup_keys::text[]) AS dedup_key) AS k
  ON i.handler = k.handler AND i.dedup_key = k.dedup_key;

-- name: InsertInboxConflicts :exec
-- InsertInboxConflicts records deliveries whose dedup key was already stored
-- for their handler with another payload fingerprint.
INSERT INTO pgrelay.inbox_conflicts (handler, dedup_key, key_strategy, stored_event_id, event_id,
                             stored_fingerprint, fingerprint, topic, event_type, payload)
SELECT pg_catalog.unnest(@handlers::text[]), pg_catalog.unnest(@dedup_keys::text[]), pg_catalog.unnest(@key_strategies::text[]),
       pg_catalog.unnest(@stored_event_ids::text[]), pg_catalog.unnest(@event_ids::text[]),
       pg_catalog.unnest(@stored_fingerprints::bytea[]), pg_catalog.unnest(@fingerprints::bytea[]),
       pg_catalog.unnest(@topics::text[]), pg_catalog.unnest(@event_types::text[]), pg_catalog.unnest(@payloads::bytea[]);

-- name: ClaimInbox :many
-- ClaimInbox moves up to @batch_size due pending events to processing under a
-- new fencing version (lock_version) and a lease. The attempt is counted here,
-- before any handler runs, and committed at once. An event already at the
-- attempt limit (only possible when the limit was lowered) goes dead instead.
-- The claim commits without waiting for its WAL flush (synchronous_commit off
-- for this statement's transaction only): it is visible to every session at
-- once and survives any crash of the worker's process; only a crash of the
-- PostgreSQL server within a fraction of a second can lose it, and then the
-- events are simply pending again, since the batch that processes them
-- commits synchronously and its WAL flush carries the claim's record first.
-- This halves the flushes per batch.
-- not_before and since start the scan of inbox_pending_idx past the entries
-- of rows the worker has already claimed: next_attempt_at at least
-- not_before, and at least now() - since (both NULL: from the start). Every
-- claim leaves a dead entry there, and while a transaction holds the xmin
-- horizon nothing removes them: a scan from the start walks them all, and
-- visits their heap tuples, on every claim. The worker keeps the bound
-- (Worker.claimFloor) and scans from the start every few seconds for a row
-- that became pending below it; next_attempt_at is returned for the bound.
WITH due AS (
    SELECT i.handler, i.dedup_key
    FROM pgrelay.inbox i
    WHERE i.handler = @handler::text AND i.status = 'pending' AND i.next_attempt_at <= pg_catalog.now()
      AND i.next_attempt_at >= greatest(sqlc.narg(not_before)::timestamptz, pg_catalog.now() - sqlc.narg(since)::interval, '-infinity')
      AND (SELECT pg_catalog.set_config('synchronous_commit', 'off', true)) IS NOT NULL
    ORDER BY i.next_attempt_at
    LIMIT @batch_size
    FOR UPDATE SKIP LOCKED
)
UPDATE pgrelay.inbox
SET status       = CASE WHEN inbox.attempts >= @max_attempts::int THEN 'dead' ELSE 'processing' END,
    attempts     = CASE WHEN inbox.attempts >= @max_attempts::int THEN inbox.attempts ELSE inbox.attempts + 1 END,
    lock_version = inbox.lock_version + 1,
    locked_by    = @worker_id::text,
    locked_until = pg_catalog.now() + @lease::interval,
    started_at   = pg_catalog.now(),
    finished_at  = CASE WHEN inbox.attempts >= @max_attempts::int THEN pg_catalog.now() END,
    last_error   = CASE WHEN inbox.attempts >= @max_attempts::int
        THEN 'attempts exhausted: ' || inbox.attempts::text || ' of ' OPERATOR(pg_catalog.||) @max_attempts::int
             || coalesce(' (last error: ' || inbox.last_error || ')', '')
        ELSE inbox.last_error END
FROM due
WHERE inbox.handler = due.handler AND inbox.dedup_key = due.dedup_key
RETURNING inbox.handler, inbox.dedup_key, inbox.event_id, inbox.topic, inbox.key, inbox.event_type, inbox.payload,
          inbox.headers, inbox.occurred_at, inbox.received_at, inbox.status,
          inbox.attempts, inbox.deferrals, inbox.lock_version, inbox.waiting_for,
          inbox.last_error, inbox.key_seq, inbox.next_attempt_at;

-- name: ClaimInboxLost :many
-- ClaimInboxLost takes over up to @batch_size events whose lease expired while
-- processing: their worker is presumed lost (crashed, partitioned, stalled).
-- Oldest leases first, so that the events of a crashed batch are retried before
-- the one retried last, which is the likeliest culprit. An event whose lost
-- attempt was its last goes dead with the reason instead of running again:
-- that is how an event that kills its process every time ends.
WITH lost AS (
    SELECT i.handler, i.dedup_key
    FROM pgrelay.inbox i
    WHERE i.handler = @handler::text AND i.status = 'processing' AND i.locked_until < pg_catalog.now()
    ORDER BY i.locked_until
    LIMIT @batch_size
    FOR UPDATE SKIP LOCKED
)
UPDATE pgrelay.inbox
SET status       = CASE WHEN inbox.attempts >= @max_attempts::int THEN 'dead' ELSE 'processing' END,
    attempts     = CASE WHEN inbox.attempts >= @max_attempts::int THEN inbox.attempts ELSE inbox.attempts + 1 END,
    lock_version = inbox.lock_version + 1,
    locked_by    = @worker_id::text,
    locked_until = pg_catalog.now() + @lease::interval,
    started_at   = pg_catalog.now(),
    finished_at  = CASE WHEN inbox.attempts >= @max_attempts::int THEN pg_catalog.now() END,
    last_error   = CASE WHEN inbox.attempts >= @max_attempts::int
        THEN 'attempts exhausted: worker lost during attempt ' || inbox.attempts::text
             || ' of ' OPERATOR(pg_catalog.||) @max_attempts::int
        ELSE 'worker lost during attempt ' || inbox.attempts::text END
FROM lost
WHERE inbox.handler = lost.handler AND inbox.dedup_key = lost.dedup_key
RETURNING inbox.handler, inbox.dedup_key, inbox.event_id, inbox.topic, inbox.key, inbox.event_type, inbox.payload,
          inbox.headers, inbox.occurred_at, inbox.received_at, inbox.status,
          inbox.attempts, inbox.deferrals, inbox.lock_version, inbox.waiting_for,
          inbox.last_error, inbox.key_seq;

-- name: MarkInboxProcessed :execrows
-- MarkInboxProcessed records that the event's handler committed; a deferral's
-- reason is cleared (the deferral is over), an earlier failure's error is kept
-- for the record. It matches
-- nothing when another worker has since taken the event over (the fencing
-- check): the caller then rolls back the handler's side effect.
UPDATE pgrelay.inbox
SET status = 'processed', finished_at = pg_catalog.now(), locked_until = NULL, waiting_for = NULL,
    last_error = CASE WHEN last_error LIKE 'deferred: %' THEN NULL ELSE last_error END
WHERE handler = @handler AND dedup_key = @dedup_key AND lock_version = @lock_version AND status = 'processing';

-- name: RetryInbox :execrows
-- RetryInbox puts a failed event back to pending, due after @delay.
UPDATE pgrelay.inbox
SET status = 'pending', next_attempt_at = pg_catalog.now() + @delay::interval, last_error = @last_error::text,
    locked_until = NULL, waiting_for = NULL
WHERE handler = @handler AND dedup_key = @dedup_key AND lock_version = @lock_version AND status = 'processing';

-- name: KillInbox :execrows
-- KillInbox moves an event to the dead letter state with a reason.
UPDATE pgrelay.inbox
SET status = 'dead', finished_at = pg_catalog.now(), last_error = @last_error::text, locked_until = NULL
WHERE handler = @handler AND dedup_key = @dedup_key AND lock_version = @lock_version AND status = 'processing';

-- name: DeferInbox :execrows
-- DeferInbox puts an event back to pending until @waiting_for is released,
-- refunding its attempt. It is due after @fallback at the latest, or at once
-- when the dependency's release is already visible. A release committing while
-- this transaction is open is caught after the commit (WakeReleasedInbox).
UPDATE pgrelay.inbox
SET status = 'pending', attempts = attempts - 1, deferrals = deferrals + 1,
    waiting_for = @waiting_for::text, locked_until = NULL,
    last_error = 'deferred: waiting for ' || @waiting_for::text,
    next_attempt_at = CASE
        WHEN EXISTS (SELECT 1 FROM pgrelay.inbox_releases r WHERE r.waiting_for = @waiting_for::text) THEN pg_catalog.now()
        ELSE pg_catalog.now() + @fallback::interval
    END
WHERE handler = @handler AND dedup_key = @dedup_key AND lock_version = @lock_version AND status = 'processing';

-- name: ReleaseInbox :one
-- ReleaseInbox records the release of every dependency in @keys (sorted and
-- distinct, so that concurrent releases take their row locks in one order) and
-- makes the events already deferred on them due at once. It returns how many
-- events it made due.
WITH recorded AS (
    INSERT INTO pgrelay.inbox_releases (waiting_for)
    SELECT pg_catalog.unnest(@keys::text[])
    ON CONFLICT (waiting_for) DO UPDATE SET released_at = pg_catalog.now()
), woken AS (
    UPDATE pgrelay.inbox
    SET next_attempt_at = pg_catalog.now(), waiting_for = NULL
    WHERE status = 'pending' AND waiting_for = ANY(@keys::text[])
    RETURNING 1
)
SELECT pg_catalog.count(*)::bigint FROM woken;

-- name: NotifyInbox :exec
-- NotifyInbox wakes the listening workers when the transaction commits.
SELECT pg_catalog.pg_notify('pgrelay_inbox', '');

-- name: WakeReleasedInbox :execrows
-- WakeReleasedInbox runs after a batch committed: it makes due at once the
-- deferred events waiting for one of @keys whose release is committed. Run
-- for the keys the batch deferred on and the keys it released, it closes the
-- race between a deferral and a release that commit concurrently: whichever
-- commits second, its check sees the other's committed record. Rows another
-- transaction holds are skipped: only a release (which makes them due itself)
-- or a claim of a due row locks a deferred row.
WITH due AS (
    SELECT i.handler, i.dedup_key
    FROM pgrelay.inbox i
    WHERE i.status = 'pending' AND i.waiting_for = ANY(@keys::text[])
      AND EXISTS (SELECT 1 FROM pgrelay.inbox_releases r WHERE r.waiting_for = i.waiting_for)
    FOR UPDATE SKIP LOCKED
)
UPDATE pgrelay.inbox
SET next_attempt_at = pg_catalog.now(), waiting_for = NULL
FROM due
WHERE inbox.handler = due.handler AND inbox.dedup_key = due.dedup_key;

-- name: SweepReleasedInbox :execrows
-- SweepReleasedInbox makes due every deferred event whose dependency has a
-- committed release: the periodic safety net behind WakeReleasedInbox, for a
-- process that died between a commit and its check, and for Release called
-- outside a worker's handler.
WITH due AS (
    SELECT i.handler, i.dedup_key
    FROM pgrelay.inbox i
    WHERE i.status = 'pending' AND i.waiting_for IS NOT NULL
      AND EXISTS (SELECT 1 FROM pgrelay.inbox_releases r WHERE r.waiting_for = i.waiting_for)
    LIMIT @batch_size
    FOR UPDATE SKIP LOCKED
)
UPDATE pgrelay.inbox
SET next_attempt_at = pg_catalog.now(), waiting_for = NULL
FROM due
WHERE inbox.handler = due.handler AND inbox.dedup_key = due.dedup_key;

-- name: UnclaimInbox :execrows
-- UnclaimInbox hands claimed events back (graceful shutdown, or a batch that
-- could not run): pending, due at once, the attempt refunded.
UPDATE pgrelay.inbox
SET status = 'pending', attempts = greatest(inbox.attempts - 1, 0), next_attempt_at = pg_catalog.now(),
    locked_until = NULL
FROM (SELECT pg_catalog.unnest(@dedup_keys::text[]) AS dedup_key,
             pg_catalog.unnest(@lock_versions::bigint[]) AS lock_version) AS c
-- coalesce on the NOT NULL status hides the partial index on processing rows
-- from the planner: statistics often say none are processing, while the index
-- holds every row claimed since the last vacuum, and scanning it per batch
-- cost 20 ms at 20,000 entries. The primary key is always the right path.
-- With no statistics at all (a new inbox, autovacuum off or behind) the
-- planner scanned every row of the handler instead (20,000 rows, 18 ms a
-- batch): the worker keeps them (maintenance.Statistics).
WHERE inbox.handler = @handler::text AND inbox.dedup_key = c.dedup_key AND inbox.lock_version = c.lock_version
  AND coalesce(inbox.status, '') = 'processing'
RETURNING inbox.dedup_key;

-- name: GetInbox :one
SELECT * FROM pgrelay.inbox WHERE handler = @handler AND dedup_key = @dedup_key;

-- name: PruneInboxReleases :execrows
-- PruneInboxReleases forgets releases older than @older_than, in batches. A
-- release only matters to a deferral whose handler ran while it committed, and
-- batches stop starting handlers at half a lease, so a release many leases
-- old is never needed.
DELETE FROM pgrelay.inbox_releases
WHERE waiting_for IN (
    SELECT r.waiting_for FROM pgrelay.inbox_releases r
    WHERE r.released_at < pg_catalog.now() - @older_than::interval
    LIMIT @batch_size
    FOR UPDATE SKIP LOCKED
);

-- name: MarkInboxBatchProcessed :many
-- MarkInboxBatchProcessed records in one statement that the handlers of a
-- whole batch committed, each row fenced by its claim's lock_version like
-- MarkInboxProcessed, and returns the ids it marked. An id missing was taken
-- over by another worker: the caller rolls the batch back and runs the others
-- again event by event. Ordered mode's batches use it (their keys advance
-- before the commit); the others send MarkInboxBatchProcessedAll with theirs.
UPDATE pgrelay.inbox
SET status = 'processed', finished_at = pg_catalog.now(), locked_until = NULL, waiting_for = NULL,
    last_error = CASE WHEN last_error LIKE 'deferred: %' THEN NULL ELSE last_error END
FROM (SELECT pg_catalog.unnest(@dedup_keys::text[]) AS dedup_key,
             pg_catalog.unnest(@lock_versions::bigint[]) AS lock_version) AS c
-- coalesce on the NOT NULL status hides the partial index on processing rows
-- from the planner: statistics often say none are processing, while the index
-- holds every row claimed since the last vacuum, and scanning it per batch
-- cost 20 ms at 20,000 entries. The primary key is always the right path.
-- With no statistics at all (a new inbox, autovacuum off or behind) the
-- planner scanned every row of the handler instead (20,000 rows, 18 ms a
-- batch): the worker keeps them (maintenance.Statistics).
WHERE inbox.handler = @handler::text AND inbox.dedup_key = c.dedup_key AND inbox.lock_version = c.lock_version
  AND coalesce(inbox.status, '') = 'processing'
RETURNING inbox.dedup_key;


-- name: MarkInboxBatchProcessedAll :exec
-- MarkInboxBatchProcessedAll is MarkInboxBatchProcessed for a batch whose
-- COMMIT is sent in the same round trip (one pgx batch: the server skips
-- what follows an error up to its Sync). It fails, and with it the
-- transaction, when it marked fewer rows than it was given: an event was
-- taken over by another worker, whose effect must not commit here. The
-- error is a cast of a text naming the counts, reached only when they
-- differ: the count is known only at run time, so the planner cannot fold
-- the cast (and raise it) while planning. SQLSTATE 22P02.
WITH marked AS (
    UPDATE pgrelay.inbox
    SET status = 'processed', finished_at = pg_catalog.now(), locked_until = NULL, waiting_for = NULL,
        last_error = CASE WHEN last_error LIKE 'deferred: %' THEN NULL ELSE last_error END
    FROM (SELECT pg_catalog.unnest(@dedup_keys::text[]) AS dedup_key,
                 pg_catalog.unnest(@lock_versions::bigint[]) AS lock_version) AS c
    -- The primary key, not the partial index on processing rows (see
    -- MarkInboxBatchProcessed).
    WHERE inbox.handler = @handler::text AND inbox.dedup_key = c.dedup_key AND inbox.lock_version = c.lock_version
      AND coalesce(inbox.status, '') = 'processing'
    RETURNING 1
)
SELECT CASE WHEN m.n = pg_catalog.cardinality(@dedup_keys::text[]) THEN m.n
            ELSE ('pgrelay: inbox batch mark matched ' || m.n::text || ' of ' || pg_catalog.cardinality(@dedup_keys::text[])::text
                  || ' events: taken over by another worker')::bigint END AS marked
FROM (SELECT pg_catalog.count(*) AS n FROM marked) AS m;

-- name: InboxStillClaimed :many
-- InboxStillClaimed returns which of the given claims (dedup key and
-- lock_version) are still processing under them: after a batch whose
-- MarkInboxBatchProcessedAll failed was rolled back, the others were taken
-- over by another worker.
SELECT inbox.dedup_key
FROM pgrelay.inbox
JOIN (SELECT pg_catalog.unnest(@dedup_keys::text[]) AS dedup_key,
             pg_catalog.unnest(@lock_versions::bigint[]) AS lock_version) AS c
  ON inbox.dedup_key = c.dedup_key AND inbox.lock_version = c.lock_version
WHERE inbox.handler = @handler::text AND coalesce(inbox.status, '') = 'processing';
