package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/db"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/ledger"
)

// producer is the application: it creates orders and pays most of them, each
// in a business transaction that writes the shop's row and enqueues the event
// with pgrelay.Enqueue. It talks to PostgreSQL directly; its transactions
// still fail while PostgreSQL restarts, and are then retried.
type producer struct {
	pool  *pgxpool.Pool
	seed  uint64
	rate  int
	say   func(string, ...any)
	topic string // the events' topic: "orders"

	// emit writes the events to the WAL (a WAL capture run), under ids
	// derived from the order, so that a retry after an ambiguous commit
	// that did commit is known to have produced its event: each
	// transaction with pgrelay.Emit or with an insert into
	// pgrelay.outbox_wal, as ways picks, and now and then both in one.
	emit bool
	ways *rand.Rand // under mu

	mu      sync.Mutex
	acked   []string       // event ids whose transaction committed
	emitted []emittedEvent // with emit: the committed events, in commit order
	nOrders int
	nTable  int // committed events inserted into pgrelay.outbox_wal
	nMixed  int // committed transactions that both emitted and inserted
	nFailed int
	unpaid  []order
}

// emittedEvent is an event the producer emitted and saw committed.
type emittedEvent struct{ id, key, eventType string }

// way is how a WAL capture run's transaction writes its events.
type way struct {
	// table inserts the event into pgrelay.outbox_wal instead of emitting
	// it with pgrelay.Emit.
	table bool
	// mixed creates the order and pays it in one transaction, the
	// OrderCreated written one way (table) and the OrderPaid the other.
	mixed bool
}

// pickWay picks a transaction's way: half of them insert into
// pgrelay.outbox_wal, half emit, and when mixedOK one in eight of them is a
// mixed transaction. A table capture run always enqueues (the zero way).
func (p *producer) pickWay(mixedOK bool) way {
	if !p.emit {
		return way{}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return way{table: p.ways.IntN(2) == 0, mixed: mixedOK && p.ways.IntN(8) == 0}
}

// walHeaders are the headers of the events inserted into pgrelay.outbox_wal:
// the content type as a plain-SQL producer states it, and one more.
var walHeaders = []byte(`{"` + event.HeaderContentType + `": "application/json", "Chaos-Via": "outbox_wal"}`)

// write writes m with Enqueue, or in a WAL capture run with Emit or, when
// table, as a row of pgrelay.outbox_wal.
func (p *producer) write(ctx context.Context, tx pgx.Tx, m pgrelay.Message, table bool) error {
	switch {
	case !p.emit:
		return pgrelay.Enqueue(ctx, tx, m)
	case table:
		return db.New().ChaosInsertOutboxWAL(ctx, tx, db.ChaosInsertOutboxWALParams{
			EventID: m.EventID, Topic: m.Topic, Key: m.Key, EventType: m.EventType, Payload: m.Payload, Headers: walHeaders,
		})
	default:
		return pgrelay.Emit(ctx, tx, m)
	}
}

// committed records the event id of a committed transaction.
// table says the event was a row of pgrelay.outbox_wal.
func (p *producer) committed(id, key, eventType string, table bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.acked = append(p.acked, id)
	if table {
		p.nTable++
	}
	if p.emit {
		p.emitted = append(p.emitted, emittedEvent{id, key, eventType})
	}
}

func (p *producer) countMixed() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.nMixed++
}

// waysUsed reports how many committed events were inserted into
// pgrelay.outbox_wal, and how many transactions both emitted and inserted.
func (p *producer) waysUsed() (table, mixed int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.nTable, p.nMixed
}

func (p *producer) emittedEvents() []emittedEvent {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]emittedEvent(nil), p.emitted...)
}

type order struct {
	id, customer string
	amount       int64
}

func newProducer(pool *pgxpool.Pool, seed uint64, rate int, say func(string, ...any)) *producer {
	return &producer{pool: pool, seed: seed, rate: rate, say: say, topic: "orders", ways: newRand(seed, 3)}
}

func (p *producer) run(ctx context.Context) {
	rng := newRand(p.seed, 2)
	tick := time.NewTicker(time.Second / time.Duration(p.rate))
	defer tick.Stop()
	next := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C: // pacing the producer
		}
		// Create a new order, or pay one created earlier, so that events of
		// many keys interleave.
		p.mu.Lock()
		nUnpaid := len(p.unpaid)
		p.mu.Unlock()
		if nUnpaid > 0 && (rng.IntN(2) == 0 || nUnpaid > 50) {
			p.mu.Lock()
			i := rng.IntN(len(p.unpaid))
			o := p.unpaid[i]
			p.unpaid = append(p.unpaid[:i], p.unpaid[i+1:]...)
			p.mu.Unlock()
			w := p.pickWay(false)
			p.retry(ctx, func() error { return p.pay(ctx, o, true, w) })
			continue
		}
		o := order{id: fmt.Sprintf("o%d-%06d", p.seed, next), customer: fmt.Sprintf("c%03d", rng.IntN(200)), amount: 100 + rng.Int64N(100000)}
		next++
		w := p.pickWay(true)
		if p.retry(ctx, func() error { return p.create(ctx, o, true, w) }) && rng.IntN(10) < 8 && !w.mixed {
			p.mu.Lock()
			p.unpaid = append(p.unpaid, o)
			p.mu.Unlock()
		}
	}
}

// retry runs f until it succeeds, ctx ends or a few attempts failed (an
// abandoned order is fine: what counts is what committed).
func (p *producer) retry(ctx context.Context, f func() error) bool {
	for attempt := 1; ; attempt++ {
		err := f()
		if err == nil {
			return true
		}
		p.mu.Lock()
		p.nFailed++
		p.mu.Unlock()
		if attempt >= 20 || ctx.Err() != nil {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(250 * time.Millisecond): // back off while PostgreSQL is away
		}
	}
}

// create writes the order and, when withEvent, its OrderCreated event (and,
// with w.mixed, pays it in the same transaction, its OrderPaid written the
// other way). A retry after an ambiguous commit that did commit finds the
// order there (unique violation) and writes nothing more.
func (p *producer) create(ctx context.Context, o order, withEvent bool, w way) error {
	id, paidID := newEventID(), ""
	if p.emit {
		id, paidID = "created-"+o.id, "paid-"+o.id
	}
	mixed := p.emit && withEvent && w.mixed
	err := p.tx(ctx, func(tx pgx.Tx) error {
		err := db.New().CreateShopOrder(ctx, tx, db.CreateShopOrderParams{OrderID: o.id, CustomerID: o.customer, AmountCents: o.amount, Currency: "EUR"})
		if err != nil || !withEvent {
			return err
		}
		err = p.write(ctx, tx, pgrelay.Message{
			EventID: id, Topic: p.topic, Key: o.id, EventType: ledger.EventOrderCreated,
			Payload: mustJSON(ledger.OrderCreated{OrderID: o.id, CustomerID: o.customer, AmountCents: o.amount, Currency: "EUR"}),
			// One order in eight is created delayed: its OrderCreated
			// holds the order's OrderPaid behind it.
			Delay: p.delayOf(o),
		}, w.table)
		if err != nil || !mixed {
			return err
		}
		if _, err := db.New().MarkShopOrderPaid(ctx, tx, o.id); err != nil {
			return err
		}
		return p.write(ctx, tx, pgrelay.Message{
			EventID: paidID, Topic: p.topic, Key: o.id, EventType: ledger.EventOrderPaid,
			Payload: mustJSON(ledger.OrderPaid{OrderID: o.id, AmountCents: o.amount, Currency: "EUR"}),
		}, !w.table)
	})
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "23505" {
		// An earlier, ambiguous attempt committed. In a WAL capture run
		// its events, under the same ids, are in the WAL and not in any
		// table the checker reads: record them, in their order.
		if p.emit && withEvent && !p.seen(id) {
			p.committed(id, o.id, ledger.EventOrderCreated, w.table)
			if mixed {
				p.committed(paidID, o.id, ledger.EventOrderPaid, !w.table)
				p.countMixed()
			}
		}
		return nil
	}
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.nOrders++
	p.mu.Unlock()
	if withEvent {
		p.committed(id, o.id, ledger.EventOrderCreated, w.table)
		if mixed {
			p.committed(paidID, o.id, ledger.EventOrderPaid, !w.table)
			p.countMixed()
		}
	}
	return nil
}

// pay marks the order paid and, when withEvent, enqueues its OrderPaid. An
// order already paid (an earlier ambiguous commit) enqueues nothing.
func (p *producer) pay(ctx context.Context, o order, withEvent bool, w way) error {
	id := newEventID()
	if p.emit {
		id = "paid-" + o.id
	}
	enqueued := false
	err := p.tx(ctx, func(tx pgx.Tx) error {
		n, err := db.New().MarkShopOrderPaid(ctx, tx, o.id)
		if err == nil && n == 0 && p.emit && withEvent && !p.seen(id) {
			// An earlier, ambiguous attempt committed, its event with it.
			enqueued = true
			return nil
		}
		if err != nil || n == 0 || !withEvent {
			return err
		}
		enqueued = true
		return p.write(ctx, tx, pgrelay.Message{
			EventID: id, Topic: p.topic, Key: o.id, EventType: ledger.EventOrderPaid,
			Payload:   mustJSON(ledger.OrderPaid{OrderID: o.id, AmountCents: o.amount, Currency: "EUR"}),
			ExpiresAt: p.expiryOf(o),
		}, w.table)
	})
	if err == nil && enqueued {
		p.committed(id, o.id, ledger.EventOrderPaid, p.emit && w.table)
	}
	return err
}

func (p *producer) tx(ctx context.Context, f func(pgx.Tx) error) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return pgx.BeginFunc(ctx, p.pool, f)
}

// seen reports whether id was recorded as committed.
func (p *producer) seen(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, a := range p.acked {
		if a == id {
			return true
		}
	}
	return false
}

func (p *producer) acknowledged() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.acked...)
}

func (p *producer) orders() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.nOrders
}

func (p *producer) failures() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.nFailed
}

func newEventID() string { return uuid.Must(uuid.NewV7()).String() }

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only called with the ledger's plain structs
	}
	return b
}

// delayOf is the delay of an order's OrderCreated (none with Emit, which
// cannot delay: docs/wal.md): 0.2 to 1.5 s for one
// order in eight (by its amount), none for the others.
func (p *producer) delayOf(o order) time.Duration {
	if p.emit || o.amount%8 != 3 {
		return 0
	}
	return 200*time.Millisecond + time.Duration(o.amount%1300)*time.Millisecond
}

// expiryOf is the expiry of an order's OrderPaid (none with Emit, whose
// relay does not check expiry before publishing): 0.1 to 2 s from now for one
// order in ten (by its amount), so that faults make some of them expire
// before the relay publishes them or a consumer applies them; none for the
// others.
func (p *producer) expiryOf(o order) time.Time {
	if p.emit || o.amount%10 != 7 {
		return time.Time{}
	}
	return time.Now().Add(100*time.Millisecond + time.Duration(o.amount%1900)*time.Millisecond)
}
