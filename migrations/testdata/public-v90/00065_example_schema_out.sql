-- +goose Up
-- The worked example's tables (ledger_orders, ledger_entries, shop_orders)
-- were pgrelay's versions 2 and 20. They now form the example schema of their
-- own (internal/ledger/migrations, version table pgrelay_example_version,
-- applied by `consumer migrate up --example-schema`), so pgrelay's version
-- table forgets those two versions: goose refuses to roll back past a
-- version it has no file for. The tables and their rows stay as they are;
-- applying the example schema adopts them.
DELETE FROM goose_db_version WHERE version_id IN (2, 20);

-- +goose Down
-- Nothing to undo: the example schema keeps the tables, recorded in its own
-- version table once applied.
SELECT 1;
