// Package ledger is pgrelay's worked example domain: a ledger that records
// orders (OrderCreated) and credits them once per payment (OrderPaid). Its
// Handler runs inside the inbox, so each credit commits with the inbox row's
// processed mark and happens exactly once per event.
package ledger

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/db"
)

// Event types the ledger handles.
const (
	EventOrderCreated = "OrderCreated"
	EventOrderPaid    = "OrderPaid"
)

// OrderCreated is the payload of an OrderCreated event.
type OrderCreated struct {
	OrderID     string `json:"order_id"`
	CustomerID  string `json:"customer_id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
}

// OrderPaid is the payload of an OrderPaid event.
type OrderPaid struct {
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
}

// DependencyKey is the name OrderPaid events defer on until their order
// exists, and that OrderCreated releases.
func DependencyKey(orderID string) string { return "order:" + orderID }

// Handler handles OrderCreated and OrderPaid events. Malformed payloads and
// unknown event types are permanent errors (the event goes dead with the
// reason); an OrderPaid for an order not created yet is deferred until it is.
type Handler struct{}

var _ pgrelay.InboxBatchHandler = Handler{}

// errNotInBulk makes the worker run a batch event by event (see
// pgrelay.InboxBatchHandler): something in it needs a per-event decision.
var errNotInBulk = errors.New("ledger: batch needs per-event handling")

// HandleBatch applies a batch of events with one statement per event type:
// the orders created, their releases, then the credits. Anything that needs a
// per-event decision (a malformed or unknown event, an OrderPaid whose order
// does not exist yet) fails the batch, which the worker then runs through
// Handle event by event.
func (Handler) HandleBatch(ctx context.Context, tx pgx.Tx, evs []*pgrelay.InboxEvent) error {
	var orders db.CreateLedgerOrdersParams
	var credits db.CreditLedgerBatchParams
	var released []string
	for _, ev := range evs {
		switch ev.EventType {
		case EventOrderCreated:
			var p OrderCreated
			if decode(ev.Payload, &p, "order_id", "customer_id", "amount_cents", "currency") != nil || p.AmountCents < 0 {
				return errNotInBulk
			}
			orders.OrderIds = append(orders.OrderIds, p.OrderID)
			orders.CustomerIds = append(orders.CustomerIds, p.CustomerID)
			orders.AmountCents = append(orders.AmountCents, p.AmountCents)
			orders.Currencies = append(orders.Currencies, p.Currency)
			orders.EventIds = append(orders.EventIds, ev.EventID)
			released = append(released, DependencyKey(p.OrderID))
		case EventOrderPaid:
			var p OrderPaid
			if decode(ev.Payload, &p, "order_id", "amount_cents", "currency") != nil {
				return errNotInBulk
			}
			credits.EventIds = append(credits.EventIds, ev.EventID)
			credits.OrderIds = append(credits.OrderIds, p.OrderID)
			credits.AmountCents = append(credits.AmountCents, p.AmountCents)
			credits.Currencies = append(credits.Currencies, p.Currency)
		default:
			return errNotInBulk
		}
	}
	q := db.New()
	if len(orders.OrderIds) > 0 {
		if _, err := q.CreateLedgerOrders(ctx, tx, orders); err != nil {
			return fmt.Errorf("ledger: create %d orders: %w", len(orders.OrderIds), err)
		}
		if err := pgrelay.Release(ctx, tx, released...); err != nil {
			return err
		}
	}
	if len(credits.EventIds) > 0 {
		n, err := q.CreditLedgerBatch(ctx, tx, credits)
		if err != nil {
			return fmt.Errorf("ledger: credit %d payments: %w", len(credits.EventIds), err)
		}
		if n != int64(len(credits.EventIds)) {
			return errNotInBulk // some order does not exist yet: defer per event
		}
	}
	return nil
}

// Handle applies one event to the ledger inside tx, with the statements
// HandleBatch runs for a batch: one round trip for an OrderPaid, whose
// order's customer the credit reads in the same statement.
func (Handler) Handle(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
	q := db.New()
	switch ev.EventType {
	case EventOrderCreated:
		var p OrderCreated
		if err := decode(ev.Payload, &p, "order_id", "customer_id", "amount_cents", "currency"); err != nil {
			return pgrelay.Permanent(fmt.Errorf("%s payload: %w", ev.EventType, err))
		}
		if p.AmountCents < 0 {
			return pgrelay.Permanent(fmt.Errorf("%s payload: amount_cents is negative (%d)", ev.EventType, p.AmountCents))
		}
		if _, err := q.CreateLedgerOrders(ctx, tx, db.CreateLedgerOrdersParams{
			OrderIds: []string{p.OrderID}, CustomerIds: []string{p.CustomerID}, AmountCents: []int64{p.AmountCents},
			Currencies: []string{p.Currency}, EventIds: []string{ev.EventID},
		}); err != nil {
			return fmt.Errorf("ledger: create order %s: %w", p.OrderID, err)
		}
		return pgrelay.Release(ctx, tx, DependencyKey(p.OrderID))
	case EventOrderPaid:
		var p OrderPaid
		if err := decode(ev.Payload, &p, "order_id", "amount_cents", "currency"); err != nil {
			return pgrelay.Permanent(fmt.Errorf("%s payload: %w", ev.EventType, err))
		}
		n, err := q.CreditLedgerBatch(ctx, tx, db.CreditLedgerBatchParams{
			EventIds: []string{ev.EventID}, OrderIds: []string{p.OrderID}, AmountCents: []int64{p.AmountCents}, Currencies: []string{p.Currency},
		})
		if err != nil {
			return fmt.Errorf("ledger: credit order %s: %w", p.OrderID, err)
		}
		if n == 0 {
			return pgrelay.Defer(DependencyKey(p.OrderID)) // the order does not exist yet
		}
		return nil
	default:
		return pgrelay.Permanent(fmt.Errorf("unknown event type %q", ev.EventType))
	}
}

// maxTextField bounds the example's identifier and currency fields.
const maxTextField = 255

// decode unmarshals a JSON object into v, requiring the named fields to be
// present and non-null, and string fields to be non-empty.
func decode(payload []byte, v any, required ...string) error {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(payload, &fields); err != nil {
		return fmt.Errorf("not a JSON object: %w", err)
	}
	var missing []string
	for _, f := range required {
		raw, ok := fields[f]
		if !ok || bytes.Equal(raw, []byte("null")) || bytes.Equal(raw, []byte(`""`)) {
			missing = append(missing, f)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing or empty field(s): %s", strings.Join(missing, ", "))
	}
	for _, f := range required {
		var s string
		if json.Unmarshal(fields[f], &s) != nil {
			continue // not a string: the typed decode below reports it
		}
		switch {
		case len(s) > maxTextField:
			return fmt.Errorf("field %s: longer than %d bytes", f, maxTextField)
		case strings.ContainsRune(s, 0):
			return fmt.Errorf("field %s: contains a NUL character, which PostgreSQL text cannot store", f)
		}
	}
	if err := json.Unmarshal(payload, v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return fmt.Errorf("field %s: want %s, got JSON %s", te.Field, te.Type, te.Value)
		}
		return err
	}
	return nil
}
