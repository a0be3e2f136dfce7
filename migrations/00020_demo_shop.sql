-- +goose Up
-- The demo shop: the business table whose rows the demo producer writes in the
-- same transactions as their outbox events (cmd/demo). It is the source of
-- truth the demo checks the ledger against.
CREATE TABLE shop_orders (
    order_id     text        PRIMARY KEY,
    customer_id  text        NOT NULL,
    amount_cents bigint      NOT NULL CHECK (amount_cents >= 0),
    currency     text        NOT NULL,
    paid         boolean     NOT NULL DEFAULT false,
    created_at   timestamptz NOT NULL DEFAULT now(),
    paid_at      timestamptz
);

-- +goose Down
DROP TABLE shop_orders;
