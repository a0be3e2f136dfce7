-- For sqlc only (sqlc.yaml): sqlc reads the migrations as the schema, but it
-- neither follows their SET LOCAL search_path nor runs the DO block of
-- migrations/00100_pgrelay_schema.sql, so it would place pgrelay's tables in
-- public. These statements put them where the migrations do: in the schema
-- pgrelay. Keep the list equal to pgrelay's tables (TestSqlcSchemaListsEveryTable).
CREATE SCHEMA IF NOT EXISTS pgrelay;
ALTER TABLE inbox SET SCHEMA pgrelay;
ALTER TABLE inbox_releases SET SCHEMA pgrelay;
ALTER TABLE inbox_conflicts SET SCHEMA pgrelay;
ALTER TABLE inbox_duplicates SET SCHEMA pgrelay;
ALTER TABLE inbox_receive_counts SET SCHEMA pgrelay;
ALTER TABLE inbox_key_state SET SCHEMA pgrelay;
ALTER TABLE outbox SET SCHEMA pgrelay;
ALTER TABLE outbox_key_seqs SET SCHEMA pgrelay;
ALTER TABLE outbox_wal SET SCHEMA pgrelay;
ALTER TABLE relay_partitions SET SCHEMA pgrelay;
ALTER TABLE relay_nodes SET SCHEMA pgrelay;
ALTER TABLE relay_wakeups SET SCHEMA pgrelay;
ALTER TABLE replay_audit SET SCHEMA pgrelay;
ALTER TABLE http_idempotency_keys SET SCHEMA pgrelay;
ALTER TABLE guard_keys SET SCHEMA pgrelay;
ALTER TABLE inbox_subscriptions SET SCHEMA pgrelay;
ALTER TABLE wal_seq_assignments SET SCHEMA pgrelay;
ALTER TABLE wal_keys SET SCHEMA pgrelay;
ALTER TABLE wal_slot_history SET SCHEMA pgrelay;
ALTER TABLE wal_gaps SET SCHEMA pgrelay;
ALTER FUNCTION emit_wal(bytea[]) SET SCHEMA pgrelay;
