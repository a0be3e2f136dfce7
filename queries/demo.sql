-- name: CreateShopOrder :exec
-- CreateShopOrder records a new order in the demo shop.
INSERT INTO shop_orders (order_id, customer_id, amount_cents, currency)
VALUES (@order_id, @customer_id, @amount_cents, @currency);

-- name: MarkShopOrderPaid :execrows
-- MarkShopOrderPaid marks an unpaid order paid; a second payment is refused.
UPDATE shop_orders SET paid = true, paid_at = pg_catalog.now()
WHERE order_id = @order_id AND NOT paid;

-- name: ShopTotals :one
-- ShopTotals is the demo shop's truth: orders, paid orders and their sum.
SELECT pg_catalog.count(*)::bigint AS orders,
       pg_catalog.count(*) FILTER (WHERE paid)::bigint AS paid_orders,
       coalesce(pg_catalog.sum(amount_cents) FILTER (WHERE paid), 0)::bigint AS paid_cents
FROM shop_orders;

-- name: DemoOutboxCounts :one
-- DemoOutboxCounts counts outbox rows by status.
SELECT pg_catalog.count(*)::bigint AS total,
       pg_catalog.count(*) FILTER (WHERE status = 'published')::bigint AS published,
       pg_catalog.count(*) FILTER (WHERE status = 'dead')::bigint AS dead
FROM pgrelay.outbox;

-- name: DemoInboxCounts :one
-- DemoInboxCounts counts inbox rows by status, with retries and deferrals.
SELECT pg_catalog.count(*)::bigint AS total,
       pg_catalog.count(*) FILTER (WHERE status = 'processed')::bigint AS processed,
       pg_catalog.count(*) FILTER (WHERE status = 'dead')::bigint AS dead,
       pg_catalog.count(*) FILTER (WHERE status IN ('pending', 'processing'))::bigint AS open,
       coalesce(pg_catalog.sum(greatest(attempts - 1, 0)), 0)::bigint AS retries,
       coalesce(pg_catalog.sum(deferrals), 0)::bigint AS deferrals
FROM pgrelay.inbox;

-- name: DemoDeadLetters :many
-- DemoDeadLetters lists the dead inbox rows with their reasons.
SELECT event_id, event_type, last_error, pg_catalog.length(payload)::int AS payload_bytes
FROM pgrelay.inbox WHERE status = 'dead' ORDER BY event_id;

-- name: DemoOutboxEvents :many
-- DemoOutboxEvents returns published events to replay as duplicates.
SELECT event_id, topic, key, event_type, payload, occurred_at
FROM pgrelay.outbox WHERE status = 'published' ORDER BY id LIMIT @max_rows;

-- name: DemoLedgerCheck :one
-- DemoLedgerCheck compares the ledger with the shop: credits per order.
SELECT pg_catalog.count(*)::bigint AS entries,
       pg_catalog.count(DISTINCT order_id)::bigint AS credited_orders,
       coalesce(pg_catalog.sum(amount_cents), 0)::bigint AS total_cents
FROM ledger_entries;

-- name: DemoInboxEvents :many
-- DemoInboxEvents returns relayed events the inbox processed, to replay as
-- duplicates when the producers emit to the WAL (no outbox rows).
SELECT event_id, topic, key, event_type, payload
FROM pgrelay.inbox WHERE status = 'processed' AND event_type IN ('OrderCreated', 'OrderPaid')
ORDER BY received_at, event_id LIMIT @max_rows;
