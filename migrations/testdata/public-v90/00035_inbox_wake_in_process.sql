-- +goose Up
-- Receive no longer notifies on every insert: a statement-level pg_notify takes
-- PostgreSQL's global notify lock at every commit that stores messages, which
-- serializes consumers. The consumer wakes its own inbox workers in-process
-- after its store commits; an ingest-only consumer notifies explicitly, and the
-- workers' jittered poll remains the fallback.
DROP TRIGGER inbox_notify_insert ON inbox;
DROP FUNCTION inbox_notify();

-- +goose Down
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
