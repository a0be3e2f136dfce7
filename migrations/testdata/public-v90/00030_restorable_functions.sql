-- +goose Up
-- outbox_partition is rewritten with a SQL-standard body. A body given as a
-- string is parsed at every call with the caller's search_path, and pg_restore
-- runs with an empty one, so restoring a dump failed at CREATE TABLE outbox
-- (its generated column calls outbox_partition, which could not find
-- outbox_partition_count). A SQL-standard body is parsed once, here: it refers
-- to outbox_partition_count by identity, records the dependency, and pg_dump
-- writes it schema-qualified. It is still inlined into the generated column.
CREATE OR REPLACE FUNCTION outbox_partition(key text) RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN ((hashtext(key)::bigint % outbox_partition_count()) + outbox_partition_count())::integer % outbox_partition_count();

-- +goose Down
CREATE OR REPLACE FUNCTION outbox_partition(key text) RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS 'SELECT ((hashtext(key)::bigint % outbox_partition_count()) + outbox_partition_count())::integer % outbox_partition_count()';
