-- name: EnqueueOutboxIdempotent :many
-- EnqueueOutboxIdempotent inserts a batch in one statement (ids in array
-- order) and skips, instead of failing on, an event id that is already stored
-- (or repeated in the batch): a unique violation would abort the caller's
-- transaction. It returns the event ids it inserted; the caller compares the
-- others with the stored rows. An empty trace context is stored as NULL.
-- not_before is the later of the message's NotBefore and, for a Delay (in
-- microseconds, 0 for none), the database's clock plus the delay. A zero Go
-- time (0001-01-01, never a valid one here) stands for NULL in
-- @not_befores and @expires_ats.
INSERT INTO pgrelay.outbox (event_id, topic, key, event_type, payload, headers, occurred_at, not_before, expires_at, traceparent, tracestate)
SELECT pg_catalog.unnest(@event_ids::text[]), pg_catalog.unnest(@topics::text[]), pg_catalog.unnest(@keys::text[]),
       pg_catalog.unnest(@event_types::text[]), pg_catalog.unnest(@payloads::bytea[]), pg_catalog.unnest(@headers::jsonb[]),
       pg_catalog.unnest(@occurred_ats::timestamptz[]),
       greatest(nullif(pg_catalog.unnest(@not_befores::timestamptz[]), '0001-01-01 00:00:00+00'),
                pg_catalog.statement_timestamp() + (nullif(pg_catalog.unnest(@delays_us::bigint[]), 0) OPERATOR(pg_catalog.*) interval '1 microsecond')),
       nullif(pg_catalog.unnest(@expires_ats::timestamptz[]), '0001-01-01 00:00:00+00'),
       NULLIF(pg_catalog.unnest(@traceparents::text[]), ''), NULLIF(pg_catalog.unnest(@tracestates::text[]), '')
ON CONFLICT (event_id) DO NOTHING
RETURNING event_id;

-- name: OutboxEventsByID :many
-- OutboxEventsByID reads the stored identity of events, to tell a duplicate
-- from a conflicting reuse of an event id.
SELECT event_id, topic, key, event_type, payload, headers
FROM pgrelay.outbox WHERE event_id = ANY(@event_ids::text[]);

-- name: HTTPIdemTryLock :one
-- HTTPIdemTryLock takes the transaction-scoped lock that marks a request with
-- this key as running; false means another request holds it.
SELECT pg_catalog.pg_try_advisory_xact_lock(1751477357, pg_catalog.hashtext(@scope::text || E'\n' || @key::text));

-- name: HTTPIdemGet :one
-- HTTPIdemGet reads a key's stored response unless it has expired.
SELECT fingerprint, method, path, status, headers, body, created_at, expires_at
FROM pgrelay.http_idempotency_keys
WHERE scope = @scope AND key = @key AND expires_at > pg_catalog.now();

-- name: HTTPIdemStore :exec
-- HTTPIdemStore stores a response; an expired row of the same key, not yet
-- cleaned, is replaced.
INSERT INTO pgrelay.http_idempotency_keys (scope, key, fingerprint, method, path, status, headers, body, expires_at)
VALUES (@scope, @key, @fingerprint, @method, @path, @status, @headers, @body, pg_catalog.now() + pg_catalog.make_interval(secs => @ttl_seconds::float8))
ON CONFLICT (scope, key) DO UPDATE
SET fingerprint = excluded.fingerprint, method = excluded.method, path = excluded.path,
    status = excluded.status, headers = excluded.headers, body = excluded.body,
    created_at = pg_catalog.now(), expires_at = excluded.expires_at
WHERE http_idempotency_keys.expires_at <= pg_catalog.now();

-- name: HTTPIdemDeleteExpired :execrows
-- HTTPIdemDeleteExpired deletes at most batch_size expired keys.
DELETE FROM pgrelay.http_idempotency_keys
WHERE (scope, key) IN (
    SELECT scope, key FROM pgrelay.http_idempotency_keys
    WHERE expires_at <= pg_catalog.now() ORDER BY expires_at LIMIT @batch_size::int
    FOR UPDATE SKIP LOCKED);

-- name: GuardReserve :one
-- GuardReserve takes a free or expired key for the holder token; no row means
-- the key is held or confirmed.
INSERT INTO pgrelay.guard_keys (key, token, state, expires_at)
VALUES (@key, @token, 'reserved', pg_catalog.now() + pg_catalog.make_interval(secs => @ttl_seconds::float8))
ON CONFLICT (key) DO UPDATE
SET token = excluded.token, state = 'reserved', created_at = pg_catalog.now(), expires_at = excluded.expires_at
WHERE guard_keys.expires_at <= pg_catalog.now()
RETURNING key;

-- name: GuardState :one
SELECT state, expires_at FROM pgrelay.guard_keys WHERE key = @key AND expires_at > pg_catalog.now();

-- name: GuardConfirm :execrows
-- GuardConfirm marks the holder's reservation done and keeps it for keep.
-- It still succeeds after the lease ran out if nobody took the key since.
UPDATE pgrelay.guard_keys
SET state = 'confirmed', expires_at = pg_catalog.now() + pg_catalog.make_interval(secs => @keep_seconds::float8)
WHERE key = @key AND token = @token AND state = 'reserved';

-- name: GuardExtend :execrows
UPDATE pgrelay.guard_keys
SET expires_at = pg_catalog.now() + pg_catalog.make_interval(secs => @ttl_seconds::float8)
WHERE key = @key AND token = @token AND state = 'reserved';

-- name: GuardRelease :execrows
DELETE FROM pgrelay.guard_keys WHERE key = @key AND token = @token AND state = 'reserved';

-- name: GuardStats :one
SELECT (SELECT pg_catalog.count(*) FROM pgrelay.guard_keys WHERE expires_at > pg_catalog.now())::bigint AS active,
       pg_catalog.pg_total_relation_size('pgrelay.guard_keys')::bigint AS bytes;

-- name: GuardDeleteExpired :execrows
DELETE FROM pgrelay.guard_keys
WHERE key IN (
    SELECT key FROM pgrelay.guard_keys WHERE expires_at <= pg_catalog.now()
    ORDER BY expires_at LIMIT @batch_size::int FOR UPDATE SKIP LOCKED);
