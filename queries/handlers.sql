-- Queries of the handlers that cmd/consumer offers to teams not writing Go.

-- name: SQLHandlerFunction :one
-- The function a sql handler calls, resolved from its name and the handler's
-- argument list: its schema-qualified name, quoted for a statement, and its
-- return type. No row when no such function exists.
SELECT (pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(p.proname))::text AS qualified_name,
       pg_catalog.format_type(p.prorettype, NULL)::text                              AS returns
FROM pg_catalog.pg_proc p
JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
WHERE p.oid = pg_catalog.to_regprocedure(sqlc.arg(signature)::text);

-- name: RecordHandlerResponse :exec
-- Records what a webhook attempt got back on the event's inbox row, unless
-- another worker has taken the event over (fencing).
UPDATE pgrelay.inbox
SET handler_status     = sqlc.narg(status)::integer,
    handler_latency_ms = sqlc.arg(latency_ms)::double precision
WHERE handler = sqlc.arg(handler) AND dedup_key = sqlc.arg(dedup_key) AND lock_version = sqlc.arg(lock_version);
