-- name: LedgerTotals :one
SELECT pg_catalog.count(*)::bigint AS entries, coalesce(pg_catalog.sum(amount_cents), 0)::bigint AS total_cents
FROM ledger_entries;

-- name: CreateLedgerOrders :execrows
-- CreateLedgerOrders records a batch of orders in one statement; orders
-- already recorded (replays, or twice in the batch) are skipped.
INSERT INTO ledger_orders (order_id, customer_id, amount_cents, currency, event_id)
SELECT pg_catalog.unnest(@order_ids::text[]), pg_catalog.unnest(@customer_ids::text[]), pg_catalog.unnest(@amount_cents::bigint[]),
       pg_catalog.unnest(@currencies::text[]), pg_catalog.unnest(@event_ids::text[])
ON CONFLICT (order_id) DO NOTHING;

-- name: CreditLedgerBatch :execrows
-- CreditLedgerBatch credits a batch of OrderPaid events in one statement, each
-- with its order's customer. An event whose order does not exist is left out:
-- the caller compares the count with the batch and handles the batch event by
-- event (where such an event is deferred).
INSERT INTO ledger_entries (event_id, order_id, customer_id, amount_cents, currency)
SELECT p.event_id, p.order_id, o.customer_id, p.amount_cents, p.currency
FROM (SELECT pg_catalog.unnest(@event_ids::text[]) AS event_id, pg_catalog.unnest(@order_ids::text[]) AS order_id,
             pg_catalog.unnest(@amount_cents::bigint[]) AS amount_cents, pg_catalog.unnest(@currencies::text[]) AS currency) AS p
JOIN ledger_orders o ON o.order_id = p.order_id;

-- name: LedgerSchemaPresent :one
-- LedgerSchemaPresent says whether the ledger handler's tables exist (the
-- example schema, internal/ledger/migrations), through the search_path, and
-- whether pgrelay's own schema does (its inbox).
SELECT (pg_catalog.to_regclass('ledger_orders') IS NOT NULL)::boolean AS orders,
       (pg_catalog.to_regclass('ledger_entries') IS NOT NULL)::boolean AS entries,
       (pg_catalog.to_regclass('pgrelay.inbox') IS NOT NULL)::boolean AS pgrelay;
