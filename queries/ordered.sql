-- Ordered apply (inbox handlers in ordered mode): see migrations/00086.

-- name: ClaimInboxOrdered :many
-- ClaimInboxOrdered is ClaimInbox for a handler in ordered mode: an event with
-- a per-key sequence is claimable only when every earlier sequence of its key
-- is applied (key_seq <= last_applied + 1; an event at or below last_applied
-- is a duplicate, claimed to be absorbed). So a key's later event is never
-- handed out while an earlier one is unapplied, whether that one is missing,
-- pending, retrying, in flight or dead; other keys flow. Events without a
-- sequence are claimed as ClaimInbox claims them.
WITH due AS (
    SELECT i.handler, i.dedup_key
    FROM pgrelay.inbox i
    WHERE i.handler = @handler::text AND i.status = 'pending' AND i.next_attempt_at <= pg_catalog.now()
      AND (i.key_seq IS NULL
           OR i.key_seq <= coalesce((SELECT s.last_applied FROM pgrelay.inbox_key_state s
                                     WHERE s.handler = i.handler AND s.key = i.key), 0) + 1)
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
          inbox.last_error, inbox.key_seq;

-- name: LockInboxKeyState :many
-- LockInboxKeyState creates the state rows of @keys (sorted and distinct, so
-- that concurrent batches lock in one order) for @handler when missing, locks
-- them for the batch transaction and returns each key's last applied
-- sequence.
INSERT INTO pgrelay.inbox_key_state AS s (handler, key)
SELECT @handler::text, k FROM pg_catalog.unnest(@keys::text[]) AS k
ON CONFLICT (handler, key) DO UPDATE SET updated_at = s.updated_at
RETURNING s.key, s.last_applied;

-- name: AdvanceInboxKeyState :execrows
-- AdvanceInboxKeyState records, in the batch transaction, the last sequence
-- applied for each key (rows locked by LockInboxKeyState), moving on over the
-- sequences absorbed at receive that follow it (absorbed_seqs, 00092), clears
-- the key's gap, and makes the next sequence due when it waits. It returns
-- how many waiting events it made due.
WITH a AS (
    SELECT pg_catalog.unnest(@keys::text[]) AS key, pg_catalog.unnest(@seqs::bigint[]) AS seq
), upd AS (
    UPDATE pgrelay.inbox_key_state s
    -- Nothing absorbed ahead (the rule): no function call.
    SET last_applied = CASE WHEN s.absorbed_seqs = '{}' THEN a.seq ELSE pgrelay.inbox_seq_fold(a.seq, s.absorbed_seqs) END,
        absorbed_seqs = CASE WHEN s.absorbed_seqs = '{}' THEN s.absorbed_seqs
                             ELSE pgrelay.inbox_seq_rest(pgrelay.inbox_seq_fold(a.seq, s.absorbed_seqs), s.absorbed_seqs) END,
        updated_at = pg_catalog.now(), missing_seq = NULL, gap_since = NULL, gap_reported_at = NULL
    FROM a
    WHERE s.handler = @handler::text AND s.key = a.key AND s.last_applied < a.seq
    RETURNING s.key, s.last_applied
)
UPDATE pgrelay.inbox i
SET next_attempt_at = pg_catalog.now(), last_error = NULL
FROM upd
WHERE i.handler = @handler::text AND i.key = upd.key AND i.key_seq = upd.last_applied + 1
  AND i.status = 'pending' AND i.next_attempt_at = 'infinity';

-- name: LockInboxKeyStates :exec
-- LockInboxKeyStates creates when missing and locks, in Receive's
-- transaction, the key state rows of (@handlers, @keys) (sorted and
-- distinct, so that concurrent callers lock in one order), before
-- MoveInboxKeySeq and AbsorbInboxKeySeqs work on them.
INSERT INTO pgrelay.inbox_key_state AS s (handler, key)
SELECT pg_catalog.unnest(@handlers::text[]), pg_catalog.unnest(@keys::text[])
ON CONFLICT (handler, key) DO UPDATE SET updated_at = s.updated_at;

-- name: MoveInboxKeySeq :one
-- MoveInboxKeySeq runs in Receive's transaction, key state locked, for a
-- delivery of @key at sequence @seq absorbed by the row (@handler,
-- @dedup_key). When that row is of the same key at a later sequence the key
-- has not reached, pending or dead, and no row carries @seq, the row moves to
-- @seq (its effect belongs at the first sequence that carried it; made due,
-- the claim condition still orders it) and its old sequence is returned, to
-- be recorded as absorbed; otherwise @seq is returned.
WITH o AS (
    SELECT i.handler, i.dedup_key, i.key_seq AS old
    FROM pgrelay.inbox i
    WHERE i.handler = @handler::text AND i.dedup_key = @dedup_key::text AND i.key = @key::text
      AND i.key_seq > @seq::bigint AND i.status IN ('pending', 'dead')
      AND @seq::bigint > coalesce((SELECT s.last_applied FROM pgrelay.inbox_key_state s
                                   WHERE s.handler = @handler::text AND s.key = @key::text), 0)
      AND NOT EXISTS (SELECT 1 FROM pgrelay.inbox j WHERE j.handler = @handler::text AND j.key = @key::text
                                              AND j.key_seq = @seq::bigint)
    FOR UPDATE
), m AS (
    UPDATE pgrelay.inbox i
    SET key_seq = @seq::bigint,
        next_attempt_at = CASE WHEN i.status = 'pending' AND i.next_attempt_at = 'infinity' THEN pg_catalog.now() ELSE i.next_attempt_at END,
        last_error = CASE WHEN i.status = 'pending' AND i.next_attempt_at = 'infinity' THEN NULL ELSE i.last_error END
    FROM o
    WHERE i.handler = o.handler AND i.dedup_key = o.dedup_key
    RETURNING o.old
)
SELECT coalesce((SELECT m.old FROM m), @seq::bigint)::bigint;

-- name: AbsorbInboxKeySeqs :execrows
-- AbsorbInboxKeySeqs records, in Receive's transaction, the sequences of
-- deliveries absorbed because their dedup key was already stored by another
-- event: (@handlers, @keys, @seqs), sorted by handler and key so that
-- concurrent calls lock key states in one order. A sequence some stored row
-- of the handler carries itself is left to that row. The others count as
-- delivered at once (an absorbed delivery has no effect of its own): the key
-- moves over them when they follow its last applied sequence, else they wait
-- in absorbed_seqs until it reaches them. It makes the next sequence due when
-- it waits, and returns how many events it made due.
WITH a AS (
    SELECT DISTINCT x.handler, x.key, x.seq
    FROM (SELECT pg_catalog.unnest(@handlers::text[]) AS handler, pg_catalog.unnest(@keys::text[]) AS key,
                 pg_catalog.unnest(@seqs::bigint[]) AS seq) AS x
    WHERE x.seq > 0
      AND NOT EXISTS (SELECT 1 FROM pgrelay.inbox i WHERE i.handler = x.handler AND i.key = x.key AND i.key_seq = x.seq)
), g AS (
    SELECT a.handler, a.key, pg_catalog.array_agg(a.seq) AS seqs FROM a GROUP BY a.handler, a.key
), st AS (
    -- A new state row takes the fold from 0; on conflict, the sequences the
    -- insert would have folded (1 .. excluded.last_applied) are merged back
    -- with the rest.
    INSERT INTO pgrelay.inbox_key_state AS s (handler, key, last_applied, absorbed_seqs)
    SELECT g.handler, g.key, pgrelay.inbox_seq_fold(0, g.seqs), pgrelay.inbox_seq_rest(pgrelay.inbox_seq_fold(0, g.seqs), g.seqs)
    FROM g
    ORDER BY g.handler, g.key
    ON CONFLICT (handler, key) DO UPDATE
    SET last_applied = pgrelay.inbox_seq_fold(s.last_applied,
            s.absorbed_seqs OPERATOR(pg_catalog.||) excluded.absorbed_seqs OPERATOR(pg_catalog.||) ARRAY(SELECT pg_catalog.generate_series(1::bigint, excluded.last_applied))),
        absorbed_seqs = pgrelay.inbox_seq_rest(
            pgrelay.inbox_seq_fold(s.last_applied,
                s.absorbed_seqs OPERATOR(pg_catalog.||) excluded.absorbed_seqs OPERATOR(pg_catalog.||) ARRAY(SELECT pg_catalog.generate_series(1::bigint, excluded.last_applied))),
            s.absorbed_seqs OPERATOR(pg_catalog.||) excluded.absorbed_seqs),
        updated_at = pg_catalog.now()
    RETURNING s.handler, s.key, s.last_applied
)
UPDATE pgrelay.inbox i
SET next_attempt_at = pg_catalog.now(), last_error = NULL
FROM st
WHERE i.handler = st.handler AND i.key = st.key AND i.key_seq = st.last_applied + 1
  AND i.status = 'pending' AND i.next_attempt_at = 'infinity';

-- name: AbsorbInboxSeqDuplicates :many
-- AbsorbInboxSeqDuplicates closes claimed events whose sequence is at or below
-- their key's last applied one: processed without running the handler, the
-- note in last_error. Fenced by lock_version like MarkInboxBatchProcessed.
UPDATE pgrelay.inbox
SET status = 'processed', finished_at = pg_catalog.now(), locked_until = NULL, waiting_for = NULL,
    last_error = 'duplicate key sequence ' || inbox.key_seq::text || ': absorbed without running the handler (key already applied up to '
                 || c.last_applied::text || ')'
FROM (SELECT pg_catalog.unnest(@dedup_keys::text[]) AS dedup_key,
             pg_catalog.unnest(@lock_versions::bigint[]) AS lock_version,
             pg_catalog.unnest(@last_applied::bigint[]) AS last_applied) AS c
WHERE inbox.handler = @handler::text AND inbox.dedup_key = c.dedup_key AND inbox.lock_version = c.lock_version
  AND coalesce(inbox.status, '') = 'processing'
RETURNING inbox.dedup_key;

-- name: WakeInboxOrdered :execrows
-- WakeInboxOrdered makes due the waiting events whose key has applied every
-- earlier sequence: the safety net behind AdvanceInboxKeyState (a hold that
-- raced with the apply of the sequence it waited for). Like HoldInboxOrdered
-- it skips rows another transaction holds, so that it never waits for a batch.
WITH w AS (
    SELECT i.handler, i.dedup_key
    FROM pgrelay.inbox i
    WHERE i.handler = @handler::text AND i.status = 'pending' AND i.next_attempt_at = 'infinity'
      AND i.key_seq IS NOT NULL
      AND i.key_seq <= coalesce((SELECT s.last_applied FROM pgrelay.inbox_key_state s
                                 WHERE s.handler = i.handler AND s.key = i.key), 0) + 1
    FOR UPDATE OF i SKIP LOCKED
)
UPDATE pgrelay.inbox i
SET next_attempt_at = pg_catalog.now(), last_error = NULL
FROM w
WHERE i.handler = w.handler AND i.dedup_key = w.dedup_key
  AND i.status = 'pending' AND i.next_attempt_at = 'infinity';

-- name: HoldInboxOrdered :execrows
-- HoldInboxOrdered makes due events that cannot run yet (an earlier sequence
-- of their key is unapplied) wait: next_attempt_at 'infinity', so that claims
-- no longer walk past them, and last_error naming the sequence they wait for.
-- It returns how many events it touched (newly held, or their note updated).
-- It skips rows another transaction holds (SKIP LOCKED): a batch updates its
-- own rows and wakes others one by one in the order of its own statements, so
-- a scan that waited for a row while holding others deadlocked with it
-- (40P01, one rolled-back batch each); a skipped row is held by the next scan.
WITH h AS (
    SELECT i.handler, i.dedup_key, coalesce(s.last_applied, 0) + 1 AS waits_for
    FROM pgrelay.inbox i
    LEFT JOIN pgrelay.inbox_key_state s ON s.handler = i.handler AND s.key = i.key
    WHERE i.handler = @handler::text AND i.status = 'pending'
      AND i.key_seq IS NOT NULL AND i.key_seq > coalesce(s.last_applied, 0) + 1
      -- due events, and waiting ones whose note names a sequence since applied
      AND (i.next_attempt_at <= pg_catalog.now()
           OR (i.next_attempt_at = 'infinity'
               AND i.last_error IS DISTINCT FROM 'waiting for key sequence ' || (coalesce(s.last_applied, 0) + 1)::text))
    FOR UPDATE OF i SKIP LOCKED
)
UPDATE pgrelay.inbox i
SET next_attempt_at = 'infinity',
    last_error = 'waiting for key sequence ' || h.waits_for::text
FROM h
WHERE i.handler = h.handler AND i.dedup_key = h.dedup_key AND i.status = 'pending';

-- name: RecordInboxGaps :exec
-- RecordInboxGaps notes, for every key of @handler with waiting events and no
-- event at its next sequence at all (a gap, as opposed to a key behind a
-- pending or dead event), the missing sequence and since when it is missing.
WITH w AS (
    SELECT i.key, coalesce(s.last_applied, 0) + 1 AS missing
    FROM pgrelay.inbox i
    LEFT JOIN pgrelay.inbox_key_state s ON s.handler = i.handler AND s.key = i.key
    WHERE i.handler = @handler::text AND i.status = 'pending' AND i.next_attempt_at = 'infinity'
      AND i.key_seq IS NOT NULL
    GROUP BY i.key, s.last_applied
), g AS (
    SELECT w.key, w.missing FROM w
    WHERE NOT EXISTS (SELECT 1 FROM pgrelay.inbox j
                      WHERE j.handler = @handler::text AND j.key = w.key AND j.key_seq = w.missing)
)
INSERT INTO pgrelay.inbox_key_state AS s (handler, key, missing_seq, gap_since)
SELECT @handler::text, g.key, g.missing, pg_catalog.now() FROM g
-- in the byte order of the keys, as LockInboxKeyState locks a batch's keys
-- (sorted in Go), so that the two never wait for each other in a cycle
ORDER BY g.key COLLATE "C"
ON CONFLICT (handler, key) DO UPDATE
SET missing_seq = excluded.missing_seq,
    gap_since = CASE WHEN s.missing_seq IS NOT DISTINCT FROM excluded.missing_seq
                     THEN coalesce(s.gap_since, excluded.gap_since) ELSE excluded.gap_since END,
    gap_reported_at = CASE WHEN s.missing_seq IS NOT DISTINCT FROM excluded.missing_seq
                           THEN s.gap_reported_at END;

-- name: ReportInboxGaps :many
-- ReportInboxGaps marks reported, and returns, the gaps of @handler open for
-- longer than @timeout and not reported yet. A gap whose missing event has
-- arrived meanwhile is not reported. A key state row a batch holds is
-- skipped (reported by a later scan), so that the scan never waits for one.
WITH r AS (
    SELECT s.handler, s.key
    FROM pgrelay.inbox_key_state s
    WHERE s.handler = @handler::text AND s.missing_seq IS NOT NULL AND s.gap_reported_at IS NULL
      AND s.gap_since < pg_catalog.now() - @timeout::interval
      AND NOT EXISTS (SELECT 1 FROM pgrelay.inbox j WHERE j.handler = s.handler AND j.key = s.key AND j.key_seq = s.missing_seq)
    FOR UPDATE SKIP LOCKED
)
UPDATE pgrelay.inbox_key_state s
SET gap_reported_at = pg_catalog.now()
FROM r
WHERE s.handler = r.handler AND s.key = r.key AND s.missing_seq IS NOT NULL AND s.gap_reported_at IS NULL
RETURNING s.key, s.last_applied, s.missing_seq::bigint AS missing_seq, s.gap_since::timestamptz AS gap_since;

-- name: ListInboxOrderedKeys :many
-- ListInboxOrderedKeys lists the keys whose events wait (of @handler, or of
-- every handler when it is empty): their last applied sequence, the sequence
-- they wait for, why (gap: it never arrived; parked: it is dead; behind: it is
-- pending, retrying or in flight), how many events wait and since when.
WITH w AS (
    SELECT i.handler, i.key, coalesce(s.last_applied, 0) AS last_applied, pg_catalog.count(*)::bigint AS held,
           pg_catalog.min(i.key_seq)::bigint AS first_held, pg_catalog.min(i.received_at)::timestamptz AS oldest_held,
           s.gap_since, s.gap_reported_at
    FROM pgrelay.inbox i
    LEFT JOIN pgrelay.inbox_key_state s ON s.handler = i.handler AND s.key = i.key
    WHERE (@handler::text = '' OR i.handler = @handler::text) AND i.status = 'pending'
      AND i.key_seq IS NOT NULL AND i.key_seq > coalesce(s.last_applied, 0) + 1
    GROUP BY i.handler, i.key, s.last_applied, s.gap_since, s.gap_reported_at
), p AS (
    -- parked keys with nothing held yet
    SELECT i.handler, i.key, s.last_applied, 0::bigint AS held, 0::bigint AS first_held,
           coalesce(i.finished_at, i.received_at) AS oldest_held, NULL::timestamptz AS gap_since, NULL::timestamptz AS gap_reported_at
    FROM pgrelay.inbox_key_state s
    JOIN pgrelay.inbox i ON i.handler = s.handler AND i.key = s.key AND i.key_seq = s.last_applied + 1 AND i.status = 'dead'
    WHERE (@handler::text = '' OR s.handler = @handler::text)
      AND NOT EXISTS (SELECT 1 FROM w WHERE w.handler = s.handler AND w.key = s.key)
), a AS (
    SELECT * FROM w UNION ALL SELECT * FROM p
)
SELECT a.handler, a.key, a.last_applied::bigint AS last_applied, (a.last_applied + 1)::bigint AS waiting_for_seq,
       coalesce((SELECT j.status FROM pgrelay.inbox j
                 WHERE j.handler = a.handler AND j.key = a.key AND j.key_seq = a.last_applied + 1
                 ORDER BY (j.status = 'dead') DESC LIMIT 1), '')::text AS next_status,
       a.held, a.first_held, a.oldest_held, a.gap_since, a.gap_reported_at
FROM a
ORDER BY a.handler, a.oldest_held NULLS FIRST, a.key
LIMIT @max_rows;

-- name: LockInboxKeyStateRow :one
-- LockInboxKeyStateRow locks one key's state row for an operator action,
-- creating it when missing.
INSERT INTO pgrelay.inbox_key_state AS s (handler, key)
VALUES (@handler::text, @key::text)
ON CONFLICT (handler, key) DO UPDATE SET updated_at = s.updated_at
RETURNING s.last_applied;

-- name: InboxSeqStatus :many
-- InboxSeqStatus returns the rows of one key at one sequence.
SELECT dedup_key, event_id, status FROM pgrelay.inbox
WHERE handler = @handler::text AND key = @key::text AND key_seq = @seq::bigint;

-- name: FirstHeldInboxSeq :one
-- FirstHeldInboxSeq returns the lowest pending sequence of a key above @above
-- (0 when none).
SELECT coalesce(pg_catalog.min(key_seq), 0)::bigint FROM pgrelay.inbox
WHERE handler = @handler::text AND key = @key::text AND status = 'pending' AND key_seq > @above::bigint;

-- name: InboxDeadOrdered :one
-- InboxDeadOrdered reads a dead event of @handler by event id, with its key
-- and sequence.
SELECT dedup_key, key, key_seq, last_error, attempts FROM pgrelay.inbox
WHERE handler = @handler::text AND event_id = @event_id::text AND status = 'dead'
LIMIT 1;

-- name: InsertOrderedSkipAudit :exec
-- InsertOrderedSkipAudit records an operator's skip in the audit trail.
INSERT INTO pgrelay.replay_audit (source, action, event_id, actor, reason, previous_attempts, previous_error, handler)
VALUES ('inbox', @action::text, @event_id::text, @actor::text, @reason::text, @previous_attempts::int,
        sqlc.narg('previous_error')::text, @handler::text);

-- name: OrderedSkipsSince :many
-- OrderedSkipsSince counts the skips of @handler audited after audit id
-- @after, by action, with the highest id seen: how a worker counts the skips
-- made by any process (admin API or CLI).
SELECT action, pg_catalog.count(*)::bigint AS n, pg_catalog.max(id)::bigint AS last_id
FROM pgrelay.replay_audit
WHERE handler = @handler::text AND action IN ('skip_gap', 'skip_dead') AND id > @after::bigint
GROUP BY action;

-- name: LastAuditID :one
SELECT coalesce(pg_catalog.max(id), 0)::bigint FROM pgrelay.replay_audit;
