-- +goose Up
-- The worked example's domain: a ledger credited by OrderPaid events.

-- ledger_orders holds the orders the ledger knows of (from OrderCreated).
CREATE TABLE ledger_orders (
    order_id     text        PRIMARY KEY,
    customer_id  text        NOT NULL,
    amount_cents bigint      NOT NULL CHECK (amount_cents >= 0),
    currency     text        NOT NULL,
    event_id     text        NOT NULL UNIQUE,
    created_at   timestamptz NOT NULL DEFAULT now()
);

-- ledger_entries holds one credit per OrderPaid event. The unique event_id is
-- the second line of defence behind the inbox: a double credit is impossible
-- even if the inbox were bypassed.
CREATE TABLE ledger_entries (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id     text        NOT NULL UNIQUE,
    order_id     text        NOT NULL REFERENCES ledger_orders (order_id),
    customer_id  text        NOT NULL,
    amount_cents bigint      NOT NULL,
    currency     text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ledger_entries_order_idx ON ledger_entries (order_id);

-- +goose Down
-- Rolling back refuses while the ledger holds entries or orders:
-- set pgrelay.force_down=on to drop it anyway (README, "Migrations").
-- +goose StatementBegin
DO $$
BEGIN
    IF lower(coalesce(current_setting('pgrelay.force_down', true), '')) NOT IN ('on', 'true', 'yes', '1')
       AND (EXISTS (SELECT 1 FROM ledger_entries) OR EXISTS (SELECT 1 FROM ledger_orders)) THEN
        RAISE EXCEPTION 'migrate down: 00002_ledger would drop data: the ledger holds entries or orders; to drop it anyway set pgrelay.force_down=on (relay|consumer migrate down --force, or PGOPTIONS="-c pgrelay.force_down=on" with the goose CLI)'
            USING ERRCODE = 'dependent_objects_still_exist';
    END IF;
END $$;
-- +goose StatementEnd
DROP TABLE ledger_entries;
DROP TABLE ledger_orders;
