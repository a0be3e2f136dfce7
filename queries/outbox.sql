-- name: LockOutboxKeys :exec
-- LockOutboxKeys takes the per-key enqueue locks of a batch in one fixed order
-- (the outbox_before_insert trigger takes them again, re-entrantly), so that
-- two transactions enqueueing the same keys in different orders cannot deadlock.
SELECT pg_catalog.pg_advisory_xact_lock(1885434465, s.h)
FROM (SELECT DISTINCT pg_catalog.hashtext(k) AS h FROM pg_catalog.unnest(@keys::text[]) AS k WHERE k <> '') AS s
ORDER BY s.h;

-- name: EnqueueOutbox :exec
-- EnqueueOutbox inserts a batch in one statement; rows get their ids in array
-- order. An empty trace context is stored as NULL.
INSERT INTO pgrelay.outbox (event_id, topic, key, event_type, payload, headers, occurred_at, traceparent, tracestate)
SELECT pg_catalog.unnest(@event_ids::text[]), pg_catalog.unnest(@topics::text[]), pg_catalog.unnest(@keys::text[]),
       pg_catalog.unnest(@event_types::text[]), pg_catalog.unnest(@payloads::bytea[]), pg_catalog.unnest(@headers::jsonb[]),
       pg_catalog.unnest(@occurred_ats::timestamptz[]),
       NULLIF(pg_catalog.unnest(@traceparents::text[]), ''), NULLIF(pg_catalog.unnest(@tracestates::text[]), '');

-- name: OutboxStatusCounts :many
SELECT status, pg_catalog.count(*)::bigint AS n FROM pgrelay.outbox GROUP BY status ORDER BY status;
