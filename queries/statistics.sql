-- Planner statistics of pgrelay's busiest tables (maintenance.Statistics).

-- name: TableStatisticsStale :one
-- TableStatisticsStale says whether the table has changed by at least
-- min_changes rows and a fraction of its rows since its statistics were last
-- taken, by ANALYZE or autovacuum. No row: no such table.
SELECT (s.n_mod_since_analyze >= greatest(sqlc.arg(min_changes)::bigint,
                                          (sqlc.arg(fraction)::float8 OPERATOR(pg_catalog.*) greatest(s.n_live_tup, c.reltuples::bigint))::bigint))::boolean AS stale
FROM pg_catalog.pg_stat_user_tables s
JOIN pg_catalog.pg_class c ON c.oid = s.relid
WHERE s.relid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('pgrelay.' || sqlc.arg(table_name)::text);

-- name: AnalyzeInbox :exec
ANALYZE pgrelay.inbox;

-- name: AnalyzeOutbox :exec
ANALYZE pgrelay.outbox;

-- name: TryStatisticsLock :one
-- TryStatisticsLock takes, for the calling transaction, the lock under which
-- one service at a time analyzes the table; false: another one is at it.
SELECT pg_catalog.pg_try_advisory_xact_lock(1885434467, pg_catalog.hashtext(sqlc.arg(table_name)::text)) AS locked;
