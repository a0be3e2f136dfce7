-- +goose Up
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
-- Only the roles the operator allows publish through the WAL capture
-- (docs/wal.md#who-can-publish). pg_logical_emit_message is executable by
-- every role, and a managed database's owner cannot revoke that, so the
-- proof travels with the message: pgrelay.emit and pgrelay.emit_wal (the
-- function pgrelay.Emit calls) sign each event with an HMAC-SHA256 (RFC
-- 2104, built from pg_catalog.sha256: pgcrypto is not required) under a key
-- of wal_keys, which no role but its owner may read; the relay checks the
-- signature and publishes nothing else. Both functions run as their owner
-- (SECURITY DEFINER) and only the roles granted EXECUTE may call them. Their
-- search_path names pg_temp last: left out, the caller's temporary schema
-- would be searched first for type names, and a caller's temporary domain
-- named text, with a CHECK calling its own function, would run that
-- function as the owner.
--
-- ipad and opad are the key padded to SHA-256's 64-byte block, XORed with
-- 0x36 and 0x5c: HMAC(k, m) = sha256(opad || sha256(ipad || m)).
CREATE TABLE wal_keys (
    id         integer     GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    secret     bytea       NOT NULL CHECK (octet_length(secret) = 32),
    ipad       bytea       NOT NULL,
    opad       bytea       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON TABLE wal_keys FROM PUBLIC;

-- wal_rotate_key adds a key (32 random bytes) and returns its id: every emit from then on signs with it; the
-- relay still accepts the older keys until they are deleted.
-- +goose StatementBegin
CREATE FUNCTION wal_rotate_key() RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pgrelay
AS $$
DECLARE
    -- 3 x 122 bits of gen_random_uuid's strong random source, hashed.
    k   bytea := pg_catalog.sha256(pg_catalog.uuid_send(pg_catalog.gen_random_uuid()) || pg_catalog.uuid_send(pg_catalog.gen_random_uuid())
                                   || pg_catalog.uuid_send(pg_catalog.gen_random_uuid()));
    ip  bytea := pg_catalog.decode(pg_catalog.repeat('36', 64), 'hex');
    op  bytea := pg_catalog.decode(pg_catalog.repeat('5c', 64), 'hex');
    kid integer;
BEGIN
    FOR i IN 0..31 LOOP
        ip := pg_catalog.set_byte(ip, i, pg_catalog.get_byte(k, i) # 54);
        op := pg_catalog.set_byte(op, i, pg_catalog.get_byte(k, i) # 92);
    END LOOP;
    INSERT INTO pgrelay.wal_keys (secret, ipad, opad) VALUES (k, ip, op) RETURNING id INTO kid;
    RETURN kid;
END;
$$;
-- +goose StatementEnd
REVOKE EXECUTE ON FUNCTION wal_rotate_key() FROM PUBLIC;
SELECT wal_rotate_key();

-- emit_wal writes each content (an event as pgrelay.Emit encodes it,
-- internal/walmsg) to the WAL, in order, as a transactional logical decoding
-- message with the prefix 'pgrelay', signed with the newest key.
-- +goose StatementBegin
CREATE FUNCTION emit_wal(contents bytea[]) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pgrelay, pg_temp
AS $$
DECLARE
    k pgrelay.wal_keys;
BEGIN
    SELECT * INTO k FROM pgrelay.wal_keys ORDER BY id DESC LIMIT 1;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgrelay.emit: no WAL signing key: pgrelay.wal_keys is empty; its owner adds one with SELECT pgrelay.wal_rotate_key()'
            USING ERRCODE = '55000';
    END IF;
    PERFORM pg_catalog.pg_logical_emit_message(true, 'pgrelay',
        pg_catalog.convert_to('hmac-sha256:' || k.id::text || ':' || pg_catalog.encode(pg_catalog.sha256(k.opad || pg_catalog.sha256(k.ipad || m)), 'hex') || E'\n', 'UTF8') || m)
    FROM pg_catalog.unnest(contents) AS m;
END;
$$;
-- +goose StatementEnd

-- emit: as 00107, signed (through emit_wal), and refusing at the call every
-- event the relay would refuse to publish, with Enqueue's rules for the
-- fields that travel as broker headers.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION emit(
    topic text,
    payload bytea,
    key text DEFAULT NULL,
    event_type text DEFAULT NULL,
    headers jsonb DEFAULT '{}',
    event_id text DEFAULT NULL,
    content_type text DEFAULT NULL,
    occurred_at timestamptz DEFAULT NULL
) RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pgrelay, pg_temp
AS $$
DECLARE
    id  text := coalesce(nullif(event_id, ''), pg_catalog.gen_random_uuid()::text);
    occurred timestamptz := coalesce(occurred_at, pg_catalog.now());
    bad text;
BEGIN
    IF topic IS NULL OR pg_catalog.octet_length(topic) > 255 OR topic !~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$' THEN
        bad := pg_catalog.format('topic %s is invalid: use letters, digits, ''-'', ''_'' and ''.'' between non-empty parts, at most 255 bytes', pg_catalog.quote_nullable(topic));
    ELSIF pg_catalog.octet_length(id) > 255 THEN
        bad := 'event_id is longer than 255 bytes';
    ELSIF id ~ '[\x01-\x1f\x7f]' THEN
        bad := 'event_id contains control characters';
    ELSIF pg_catalog.octet_length(key) > 1024 THEN
        bad := 'key is longer than 1024 bytes';
    ELSIF key ~ '[\r\n]' THEN
        bad := 'key contains a line break';
    ELSIF event_type ~ '[\r\n]' THEN
        bad := 'event_type contains a line break';
    ELSIF content_type ~ '[\r\n]' THEN
        bad := 'content_type contains a line break';
    ELSIF NOT (occurred > '0001-01-01 00:00:00+00'::timestamptz AND occurred < '10000-01-01 00:00:00+00'::timestamptz) THEN
        bad := 'occurred_at is out of range: after 0001-01-01T00:00:00Z and at most 9999-12-31T23:59:59.999999Z';
    ELSIF headers IS NOT NULL AND pg_catalog.jsonb_typeof(headers) <> 'object' THEN
        bad := 'headers must be a JSON object of strings';
    ELSIF headers IS NOT NULL THEN
        SELECT pg_catalog.format('header %s: %s', pg_catalog.quote_literal(h.key),
                   CASE WHEN h.key !~ '^[A-Za-z0-9_-]{1,255}$' THEN 'the name must be 1 to 255 letters, digits, ''-'' and ''_'''
                        WHEN pg_catalog.jsonb_typeof(h.value) <> 'string' THEN 'headers must be a JSON object of strings'
                        WHEN h.value #>> '{}' ~ '[\r\n]' THEN 'the value contains a line break'
                        ELSE 'set both as content_type and as a header' END)
        INTO bad
        FROM pg_catalog.jsonb_each(headers) AS h
        WHERE h.key !~ '^[A-Za-z0-9_-]{1,255}$' OR pg_catalog.jsonb_typeof(h.value) <> 'string' OR h.value #>> '{}' ~ '[\r\n]'
           OR (h.key = 'Pgrelay-Content-Type' AND coalesce(content_type, '') <> '')
        LIMIT 1;
    END IF;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'pgrelay.emit: %', bad USING ERRCODE = '22023';
    END IF;
    PERFORM pgrelay.emit_wal(ARRAY[pg_catalog.convert_to(pg_catalog.jsonb_strip_nulls(pg_catalog.jsonb_build_object(
        'v', 1,
        'id', id,
        'topic', topic,
        'key', nullif(key, ''),
        'type', nullif(event_type, ''),
        'ct', nullif(content_type, ''),
        'headers', CASE WHEN headers = '{}'::jsonb THEN NULL ELSE headers END,
        'at', pg_catalog.to_char(occurred AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'payload', pg_catalog.encode(coalesce(payload, ''::bytea), 'base64')
    ))::text, 'UTF8')]);
    RETURN id;
END;
$$;
-- +goose StatementEnd

-- Producing is a privilege: the operator grants EXECUTE on both functions
-- to the producing roles (docs/wal.md#who-can-publish). The roles that may
-- insert into pgrelay.outbox or pgrelay.outbox_wal may already produce any
-- event: they are granted it here, so an upgrade keeps them producing.
REVOKE EXECUTE ON FUNCTION emit(text, bytea, text, text, jsonb, text, text, timestamptz), emit_wal(bytea[]) FROM PUBLIC;
-- +goose StatementBegin
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT DISTINCT a.grantee
             FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
             WHERE c.oid IN ('pgrelay.outbox'::regclass, 'pgrelay.outbox_wal'::regclass)
               AND a.privilege_type = 'INSERT' AND a.grantee <> c.relowner LOOP
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION pgrelay.emit(text, bytea, text, text, jsonb, text, text, timestamptz), pgrelay.emit_wal(bytea[]) TO %s',
            CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE pg_catalog.quote_ident(g.grantee::regrole::text) END);
    END LOOP;
END $$;
-- +goose StatementEnd

-- +goose Down
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
-- pgrelay.emit writes unsigned messages again, which any role may call;
-- events still in the slot signed by this version are unreadable by an older
-- relay (it skips them as undecodable).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION emit(
    topic text,
    payload bytea,
    key text DEFAULT NULL,
    event_type text DEFAULT NULL,
    headers jsonb DEFAULT '{}',
    event_id text DEFAULT NULL,
    content_type text DEFAULT NULL,
    occurred_at timestamptz DEFAULT NULL
) RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pgrelay
AS $$
DECLARE
    id text := coalesce(nullif(event_id, ''), pg_catalog.gen_random_uuid()::text);
BEGIN
    IF topic IS NULL OR pg_catalog.octet_length(topic) > 255 OR topic !~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$' THEN
        RAISE EXCEPTION 'pgrelay.emit: topic % is invalid: use letters, digits, ''-'', ''_'' and ''.'' between non-empty parts, at most 255 bytes', pg_catalog.quote_nullable(topic)
            USING ERRCODE = '22023';
    END IF;
    IF pg_catalog.octet_length(id) > 255 THEN
        RAISE EXCEPTION 'pgrelay.emit: event_id is longer than 255 bytes' USING ERRCODE = '22023';
    END IF;
    IF key IS NOT NULL AND pg_catalog.octet_length(key) > 1024 THEN
        RAISE EXCEPTION 'pgrelay.emit: key is longer than 1024 bytes' USING ERRCODE = '22023';
    END IF;
    IF headers IS NOT NULL AND pg_catalog.jsonb_typeof(headers) <> 'object' THEN
        RAISE EXCEPTION 'pgrelay.emit: headers must be a JSON object of strings' USING ERRCODE = '22023';
    END IF;
    PERFORM pg_catalog.pg_logical_emit_message(true, 'pgrelay', pg_catalog.convert_to(pg_catalog.jsonb_strip_nulls(pg_catalog.jsonb_build_object(
        'v', 1,
        'id', id,
        'topic', topic,
        'key', nullif(key, ''),
        'type', nullif(event_type, ''),
        'ct', nullif(content_type, ''),
        'headers', CASE WHEN headers = '{}'::jsonb THEN NULL ELSE headers END,
        'at', pg_catalog.to_char(coalesce(occurred_at, pg_catalog.now()) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'payload', pg_catalog.encode(coalesce(payload, ''::bytea), 'base64')
    ))::text, 'UTF8'));
    RETURN id;
END;
$$;
-- +goose StatementEnd
GRANT EXECUTE ON FUNCTION emit(text, bytea, text, text, jsonb, text, text, timestamptz) TO PUBLIC;
DROP FUNCTION emit_wal(bytea[]);
DROP FUNCTION wal_rotate_key();
DROP TABLE wal_keys;
