-- +goose Up
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
-- The worked example's tables (ledger_orders, ledger_entries, shop_orders)
-- were pgrelay's versions 2 and 20. They now form the example schema of their
-- own (internal/ledger/migrations, version table pgrelay_example_version,
-- applied by `consumer migrate up --example-schema`). The tables and their
-- rows stay as they are; applying the example schema adopts them.
--
-- This migration used to delete versions 2 and 20 from goose_db_version, the
-- version table pgrelay then shared with the application: those rows can be
-- the application's own. It now does nothing. pgrelay's versions live in
-- pgrelay.goose_db_version (docs/schema.md), which never records 2 or 20:
-- adopting an older installation copies only the versions whose objects
-- exist, and 2 and 20 are no longer pgrelay's.
SELECT 1;

-- +goose Down
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
SELECT 1;
