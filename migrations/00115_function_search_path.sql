-- +goose Up
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
-- Every pgrelay function resolves the names in its body in pg_catalog and
-- pgrelay only, whatever the caller's search_path: a function planted in a
-- schema on that path (public, say) is never called with pgrelay's rights.
-- +goose StatementBegin
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid FROM pg_catalog.pg_proc p WHERE p.pronamespace OPERATOR(pg_catalog.=) 'pgrelay'::regnamespace LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, pgrelay', f);
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
-- pgrelay.emit kept its own setting (00107).
-- +goose StatementBegin
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid FROM pg_catalog.pg_proc p WHERE p.pronamespace OPERATOR(pg_catalog.=) 'pgrelay'::regnamespace LOOP
        IF f OPERATOR(pg_catalog.=) 'pgrelay.emit(text, bytea, text, text, jsonb, text, text, timestamptz)'::regprocedure THEN
            EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog', f);
        ELSE
            EXECUTE pg_catalog.format('ALTER FUNCTION %s RESET search_path', f);
        END IF;
    END LOOP;
END
$$;
-- +goose StatementEnd
