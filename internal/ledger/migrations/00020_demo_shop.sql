-- +goose Up
-- The demo shop: the business table whose rows the demo producer writes in the
-- same transactions as their outbox events (cmd/demo). It is the source of
-- truth the demo checks the ledger against. Example schema, like
-- 00002_ledger.sql (which says why IF NOT EXISTS).
CREATE TABLE IF NOT EXISTS shop_orders (
    order_id     text        PRIMARY KEY,
    customer_id  text        NOT NULL,
    amount_cents bigint      NOT NULL CHECK (amount_cents >= 0),
    currency     text        NOT NULL,
    paid         boolean     NOT NULL DEFAULT false,
    created_at   timestamptz NOT NULL DEFAULT now(),
    paid_at      timestamptz
);

-- +goose Down
-- Rolling back refuses while shop_orders holds orders:
-- set pgrelay.force_down=on to drop it anyway (README, "Migrations").
-- +goose StatementBegin
DO $$
BEGIN
    IF lower(coalesce(current_setting('pgrelay.force_down', true), '')) NOT IN ('on', 'true', 'yes', '1')
       AND EXISTS (SELECT 1 FROM shop_orders) THEN
        RAISE EXCEPTION 'migrate down: 00020_demo_shop would drop data: shop_orders holds orders; to drop it anyway set pgrelay.force_down=on (PGOPTIONS="-c pgrelay.force_down=on" with the goose CLI)'
            USING ERRCODE = 'dependent_objects_still_exist';
    END IF;
END $$;
-- +goose StatementEnd
DROP TABLE shop_orders;
