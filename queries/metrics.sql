-- The figures behind the services' database gauges (/metrics), also shown by
-- the operators' statistics.

-- name: InboxGauges :one
-- InboxGauges returns the inbox figures exported as gauges. Every part is
-- served by a partial index or the catalog, so it stays cheap however many
-- processed rows the dedup window holds. The oldest claimable row ignores rows
-- backing off (next_attempt_at in the future): it measures how long ready work
-- has waited for a worker, including work whose lease expired.
SELECT
    (SELECT pg_catalog.count(*) FROM pgrelay.inbox WHERE status = 'pending')::bigint    AS pending,
    (SELECT pg_catalog.count(*) FROM pgrelay.inbox WHERE status = 'processing')::bigint AS processing,
    (SELECT pg_catalog.count(*) FROM pgrelay.inbox WHERE status = 'dead')::bigint       AS dead,
    coalesce(extract(epoch FROM pg_catalog.now() - least(
        (SELECT pg_catalog.min(next_attempt_at) FROM pgrelay.inbox WHERE status = 'pending' AND next_attempt_at <= pg_catalog.now()),
        (SELECT pg_catalog.min(locked_until) FROM pgrelay.inbox WHERE status = 'processing' AND locked_until <= pg_catalog.now())
    )), 0)::float8 AS oldest_claimable_seconds,
    coalesce(extract(epoch FROM pg_catalog.now() - (SELECT pg_catalog.min(received_at) FROM pgrelay.inbox WHERE status = 'pending')), 0)::float8 AS oldest_pending_seconds,
    (SELECT greatest(c.reltuples, 0) FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) 'pgrelay.inbox'::regclass)::bigint AS rows_estimate,
    pg_catalog.pg_total_relation_size('pgrelay.inbox'::regclass)::bigint AS table_bytes;

-- name: OutboxGauges :one
-- OutboxGauges returns the outbox figures exported as gauges, from the
-- partial indexes and the catalog. The oldest pending age ignores rows backing
-- off after a transient publish failure: it is the relay's lag.
SELECT
    (SELECT pg_catalog.count(*) FROM pgrelay.outbox WHERE status = 'pending')::bigint AS pending,
    (SELECT pg_catalog.count(*) FROM pgrelay.outbox WHERE status = 'dead')::bigint    AS dead,
    coalesce(extract(epoch FROM pg_catalog.now() - (
        SELECT pg_catalog.min(created_at) FROM pgrelay.outbox
        WHERE status = 'pending' AND (next_attempt_at IS NULL OR next_attempt_at <= pg_catalog.now())
    )), 0)::float8 AS oldest_pending_seconds,
    pg_catalog.pg_total_relation_size('pgrelay.outbox'::regclass)::bigint AS table_bytes;
