-- +goose Up
-- emit(...) writes one event to the write-ahead log for a relay capturing from
-- the WAL (docs/wal.md), from plain SQL: a transactional logical decoding
-- message with the prefix 'pgrelay', decoded only if the transaction commits,
-- in the JSON format pgrelay.Emit writes (internal/walmsg). No table is
-- touched. It returns the event id (a new random UUID when none is given).
-- The topic follows the outbox's rule (outbox_topic_valid). The function only
-- builds the message: it needs no privilege beyond calling
-- pg_logical_emit_message, which any role may.
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
-- +goose StatementBegin
CREATE FUNCTION emit(
    topic text,
    payload bytea,
    key text DEFAULT NULL,
    event_type text DEFAULT NULL,
    headers jsonb DEFAULT '{}',
    event_id text DEFAULT NULL,
    content_type text DEFAULT NULL,
    occurred_at timestamptz DEFAULT NULL
) RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog
AS $$
DECLARE
    id text := coalesce(nullif(event_id, ''), gen_random_uuid()::text);
BEGIN
    IF topic IS NULL OR octet_length(topic) > 255 OR topic !~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$' THEN
        RAISE EXCEPTION 'pgrelay.emit: topic % is invalid: use letters, digits, ''-'', ''_'' and ''.'' between non-empty parts, at most 255 bytes', quote_nullable(topic)
            USING ERRCODE = '22023';
    END IF;
    IF octet_length(id) > 255 THEN
        RAISE EXCEPTION 'pgrelay.emit: event_id is longer than 255 bytes' USING ERRCODE = '22023';
    END IF;
    IF key IS NOT NULL AND octet_length(key) > 1024 THEN
        RAISE EXCEPTION 'pgrelay.emit: key is longer than 1024 bytes' USING ERRCODE = '22023';
    END IF;
    IF headers IS NOT NULL AND jsonb_typeof(headers) <> 'object' THEN
        RAISE EXCEPTION 'pgrelay.emit: headers must be a JSON object of strings' USING ERRCODE = '22023';
    END IF;
    PERFORM pg_logical_emit_message(true, 'pgrelay', convert_to(jsonb_strip_nulls(jsonb_build_object(
        'v', 1,
        'id', id,
        'topic', topic,
        'key', nullif(key, ''),
        'type', nullif(event_type, ''),
        'ct', nullif(content_type, ''),
        'headers', CASE WHEN headers = '{}'::jsonb THEN NULL ELSE headers END,
        'at', to_char(coalesce(occurred_at, now()) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'payload', encode(coalesce(payload, ''::bytea), 'base64')
    ))::text, 'UTF8'));
    RETURN id;
END;
$$;
-- +goose StatementEnd

-- +goose Down
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
DROP FUNCTION emit(text, bytea, text, text, jsonb, text, text, timestamptz);
