-- +goose Up
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
-- A relay with a session of its own on PostgreSQL holds a session-level
-- advisory lock on a random key for as long as that session lasts
-- (docs/relay.md, "Partitions, leases and fencing"). relay_nodes.lock_key is
-- the key of the relay's current session; relay_partitions.owner_lock_key the
-- key of the session its owner took or renewed the lease under. Once no
-- session holds a node's key, its partitions under that key move without
-- waiting for their leases. NULL: lease only (a relay behind a pooler in
-- transaction mode, or one from before this version).
ALTER TABLE relay_nodes ADD COLUMN lock_key bigint;
ALTER TABLE relay_partitions ADD COLUMN owner_lock_key bigint;

-- +goose Down
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
ALTER TABLE relay_partitions DROP COLUMN owner_lock_key;
ALTER TABLE relay_nodes DROP COLUMN lock_key;
