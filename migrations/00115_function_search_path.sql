-- +goose Up
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
-- Nothing a pgrelay function calls resolves through the caller's search_path:
-- a function or operator planted in a schema on that path (public, say) is
-- never called with pgrelay's rights (docs/schema.md). A body in a string is
-- parsed at its call, so its function runs with search_path = pg_catalog,
-- pgrelay. A SQL-standard body (RETURN, BEGIN ATOMIC) is bound when it is
-- created and needs no clause, which would stop PostgreSQL inlining it: the
-- outbox's default event id, called for every row a producer inserts without
-- one, takes such a body. outbox_partition has one already (00030), and the
-- body of outbox_partition_count names nothing. (overlay(... PLACING ...),
-- substring(... FROM ...) and EXTRACT are SQL syntax for pg_catalog's.)
CREATE OR REPLACE FUNCTION outbox_uuidv7() RETURNS uuid
    LANGUAGE sql VOLATILE PARALLEL SAFE
    RETURN pg_catalog.encode(
        pg_catalog.set_bit(pg_catalog.set_bit(
            overlay(pg_catalog.uuid_send(pg_catalog.gen_random_uuid())
                    PLACING substring(pg_catalog.int8send(pg_catalog.floor(EXTRACT(epoch FROM pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.*) 1000)::bigint) FROM 3)
                    FROM 1 FOR 6),
            52, 1), 53, 1),
        'hex')::uuid;

-- +goose StatementBegin
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid FROM pg_catalog.pg_proc p
             WHERE p.pronamespace OPERATOR(pg_catalog.=) 'pgrelay'::regnamespace AND p.prosqlbody IS NULL
               AND p.oid OPERATOR(pg_catalog.<>) 'pgrelay.outbox_partition_count()'::regprocedure LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, pgrelay', f);
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
-- pgrelay.emit keeps its own setting (00107).
-- +goose StatementBegin
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid FROM pg_catalog.pg_proc p
             WHERE p.pronamespace OPERATOR(pg_catalog.=) 'pgrelay'::regnamespace AND p.proconfig IS NOT NULL LOOP
        IF f OPERATOR(pg_catalog.=) 'pgrelay.emit(text, bytea, text, text, jsonb, text, text, timestamptz)'::regprocedure THEN
            EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog', f);
        ELSE
            EXECUTE pg_catalog.format('ALTER FUNCTION %s RESET search_path', f);
        END IF;
    END LOOP;
END
$$;
-- +goose StatementEnd

CREATE OR REPLACE FUNCTION outbox_uuidv7() RETURNS uuid
    LANGUAGE sql VOLATILE PARALLEL SAFE
    AS $$
    SELECT encode(
        set_bit(set_bit(
            overlay(uuid_send(gen_random_uuid())
                    PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
                    FROM 1 FOR 6),
            52, 1), 53, 1),
        'hex')::uuid
    $$;
