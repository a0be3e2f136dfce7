-- name: CreateLedgerOrder :execrows
-- CreateLedgerOrder records an order from its OrderCreated event. A replay of
-- the same order is a no-op.
INSERT INTO ledger_orders (order_id, customer_id, amount_cents, currency, event_id)
VALUES (@order_id, @customer_id, @amount_cents, @currency, @event_id)
ON CONFLICT (order_id) DO NOTHING;

-- name: GetLedgerOrder :one
SELECT * FROM ledger_orders WHERE order_id = @order_id;

-- name: CreditLedger :execrows
-- CreditLedger credits an order once per OrderPaid event.
INSERT INTO ledger_entries (event_id, order_id, customer_id, amount_cents, currency)
VALUES (@event_id, @order_id, @customer_id, @amount_cents, @currency);

-- name: LedgerTotals :one
SELECT count(*)::bigint AS entries, coalesce(sum(amount_cents), 0)::bigint AS total_cents
FROM ledger_entries;
