package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The benchmark's events are the worked example's OrderPaid events, each
// crediting one of a fixed set of orders, keyed by the order id.
const (
	topic     = "orders"
	eventType = "OrderPaid"
	orders    = 1_000
	currency  = "EUR"
)

// paid is the OrderPaid payload.
type paid struct {
	OrderID     string `json:"order_id"`
	CustomerID  string `json:"customer_id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
}

func parsePaid(b []byte) (paid, error) {
	var p paid
	if err := json.Unmarshal(b, &p); err != nil {
		return p, fmt.Errorf("bad OrderPaid payload: %w", err)
	}
	return p, nil
}

func orderID(i int) string    { return "order-" + strconv.Itoa(i%orders) }
func customerID(i int) string { return "customer-" + strconv.Itoa(i%orders%97) }

// generator makes the i-th event of a run; ids are unique per generator.
type generator struct{ prefix string }

func newGenerator(label string) generator {
	return generator{prefix: label + "-" + randomHex(4) + "-"}
}

type genEvent struct {
	id, key string
	payload []byte
}

func (g generator) event(i int) genEvent {
	p, _ := json.Marshal(paid{OrderID: orderID(i), CustomerID: customerID(i), AmountCents: int64(100 + i%900), Currency: currency})
	return genEvent{id: g.prefix + strconv.Itoa(i), key: orderID(i), payload: p}
}

type genBatch struct {
	ids, keys []string
	payloads  [][]byte
}

func (g generator) batch(from, to int) genBatch {
	var b genBatch
	for i := from; i < to; i++ {
		e := g.event(i)
		b.ids = append(b.ids, e.id)
		b.keys = append(b.keys, e.key)
		b.payloads = append(b.payloads, e.payload)
	}
	return b
}

// seedOrders creates the orders the OrderPaid events credit (as the
// OrderCreated events would have).
func seedOrders(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `INSERT INTO ledger_orders (order_id, customer_id, amount_cents, currency, event_id)
SELECT 'order-' || i, 'customer-' || (i % 97), 100000, 'EUR', 'created-' || i
FROM generate_series(0, $1::int - 1) AS i`, orders)
	if err != nil {
		return fmt.Errorf("seed orders: %w", err)
	}
	return nil
}
