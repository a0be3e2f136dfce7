-- name: LockOutboxKeys :exec
-- LockOutboxKeys takes the per-key enqueue locks of a batch in one fixed order
-- (the outbox_before_insert trigger takes them again, re-entrantly), so that
-- two transactions enqueueing the same keys in different orders cannot deadlock.
SELECT pg_advisory_xact_lock(1885434465, s.h)
FROM (SELECT DISTINCT hashtext(k) AS h FROM unnest(@keys::text[]) AS k WHERE k <> '') AS s
ORDER BY s.h;

-- name: EnqueueOutbox :exec
-- EnqueueOutbox inserts a batch in one statement; rows get their ids in array
-- order. An empty trace context is stored as NULL.
INSERT INTO pgrelay.outbox (event_id, topic, key, event_type, payload, headers, occurred_at, traceparent, tracestate)
SELECT unnest(@event_ids::text[]), unnest(@topics::text[]), unnest(@keys::text[]),
       unnest(@event_types::text[]), unnest(@payloads::bytea[]), unnest(@headers::jsonb[]),
       unnest(@occurred_ats::timestamptz[]),
       NULLIF(unnest(@traceparents::text[]), ''), NULLIF(unnest(@tracestates::text[]), '');

-- name: OutboxStatusCounts :many
SELECT status, count(*)::bigint AS n FROM pgrelay.outbox GROUP BY status ORDER BY status;
