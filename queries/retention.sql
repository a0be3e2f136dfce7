-- Inbox retention: processed rows past the dedup window, and the conflict and
-- release records of the same age, deleted in bounded batches.

-- name: DeleteExpiredInboxBatch :execrows
-- DeleteExpiredInboxBatch deletes up to batch_size processed inbox rows whose
-- dedup window (window_seconds) has passed, by key. SKIP LOCKED means it never
-- waits on a row another transaction holds; the status is checked again on
-- the row itself.
DELETE FROM pgrelay.inbox
WHERE (handler, dedup_key) IN (
    SELECT e.handler, e.dedup_key FROM pgrelay.inbox e
    WHERE e.status = 'processed'
      AND e.finished_at < pg_catalog.now() - pg_catalog.make_interval(secs => @window_seconds::float8)
    ORDER BY e.finished_at
    LIMIT @batch_size
    FOR UPDATE SKIP LOCKED
)
AND status = 'processed';

-- name: DeleteExpiredInboxConflicts :execrows
-- DeleteExpiredInboxConflicts forgets recorded conflicts older than the
-- dedup window, in batches.
DELETE FROM pgrelay.inbox_conflicts
WHERE id IN (
    SELECT c.id FROM pgrelay.inbox_conflicts c
    WHERE c.detected_at < pg_catalog.now() - pg_catalog.make_interval(secs => @window_seconds::float8)
    ORDER BY c.detected_at
    LIMIT @batch_size
);
