-- +goose Up
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
-- Receive no longer notifies on every insert: a statement-level pg_notify takes
-- PostgreSQL's global notify lock at every commit that stores messages, which
-- serializes consumers. The consumer wakes its own inbox workers in-process
-- after its store commits; an ingest-only consumer notifies explicitly, and the
-- workers' jittered poll remains the fallback.
DROP TRIGGER inbox_notify_insert ON inbox;
DROP FUNCTION inbox_notify();

-- +goose Down
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
-- +goose StatementBegin
CREATE FUNCTION inbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('pgrelay_inbox', '');
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER inbox_notify_insert AFTER INSERT ON inbox
    FOR EACH STATEMENT EXECUTE FUNCTION inbox_notify();
