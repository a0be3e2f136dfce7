package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/internal/ledger"
)

// TestApplyOnReceive: events are applied in the transaction that stores them; with
// NoApplyOnReceive the workers apply every one. Both credit each event once.
func TestApplyOnReceive(t *testing.T) {
	t.Parallel()
	for _, off := range []bool{false, true} {
		b := setup(t)
		b.cfg.NoApplyOnReceive = off
		c, err := newConsumer(b.config())
		require.NoError(t, err)
		stop := b.start(t, c)

		// One event at a time: the consumer keeps up.
		const orders = 5
		var total int64
		for i := range orders {
			order, amount := fmt.Sprintf("o-%d", i), int64(100+i)
			total += amount
			b.publish(t, "created-"+order, "created-"+order, ledger.EventOrderCreated,
				ledger.OrderCreated{OrderID: order, CustomerID: "c", AmountCents: amount, Currency: "EUR"})
			require.Eventually(t, func() bool { return c.Stats().Acked == int64(2*i+1) }, 10*time.Second, 5*time.Millisecond)
			b.publish(t, "paid-"+order, "paid-"+order, ledger.EventOrderPaid,
				ledger.OrderPaid{OrderID: order, AmountCents: amount, Currency: "EUR"})
			require.Eventually(t, func() bool { return c.Stats().Acked == int64(2*i+2) }, 10*time.Second, 5*time.Millisecond)
		}
		require.Eventually(t, b.settled(t, orders, total, 2*orders), 10*time.Second, 20*time.Millisecond)
		require.NoError(t, stop())
		if off {
			require.Zero(t, c.Stats().AppliedOnReceive, "NoApplyOnReceive must leave every event to the workers")
		} else {
			require.Positive(t, c.Stats().AppliedOnReceive, "no event was applied on receive")
		}
	}
}

// TestApplyOnReceiveFailureLeavesTheEventToTheWorkers: a handler that fails
// when run on receive has its effect rolled back and the event stored
// pending; a worker then applies it, with that failed run not counted as an
// attempt, and it is credited once.
func TestApplyOnReceiveFailureLeavesTheEventToTheWorkers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls atomic.Int64
	b.cfg.Inbox.Handler = pgrelay.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
		if err := (ledger.Handler{}).Handle(ctx, tx, ev); err != nil {
			return err
		}
		if ev.EventType == ledger.EventOrderPaid && calls.Add(1) == 1 {
			return errors.New("first run fails after its credit")
		}
		return nil
	})
	c, err := newConsumer(b.config())
	require.NoError(t, err)
	b.start(t, c)

	b.publish(t, "created-o-1", "created-o-1", ledger.EventOrderCreated,
		ledger.OrderCreated{OrderID: "o-1", CustomerID: "c", AmountCents: 700, Currency: "EUR"})
	require.Eventually(t, func() bool { return c.Stats().AppliedOnReceive == 1 }, 10*time.Second, 5*time.Millisecond)
	b.publish(t, "paid-o-1", "paid-o-1", ledger.EventOrderPaid,
		ledger.OrderPaid{OrderID: "o-1", AmountCents: 700, Currency: "EUR"})
	require.Eventually(t, b.settled(t, 1, 700, 2), 10*time.Second, 20*time.Millisecond)
	require.EqualValues(t, 2, calls.Load(), "the paid event runs on receive, fails, and runs once more in a worker")
	require.EqualValues(t, 1, c.Stats().AppliedOnReceive)
	var attempts int
	require.NoError(t, b.pool.QueryRow(context.Background(),
		`SELECT attempts FROM pgrelay.inbox WHERE event_id = 'paid-o-1'`).Scan(&attempts))
	require.Equal(t, 1, attempts, "the rolled-back run on receive is not an attempt")
}

// oneShotSubscriber hands out its deliveries once, then nothing.
type oneShotSubscriber struct {
	mu sync.Mutex
	ds []broker.Delivery
}

func (s *oneShotSubscriber) Fetch(ctx context.Context, _ int, maxWait time.Duration) ([]broker.Delivery, error) {
	s.mu.Lock()
	ds := s.ds
	s.ds = nil
	s.mu.Unlock()
	if len(ds) == 0 {
		select {
		case <-ctx.Done():
		case <-time.After(maxWait):
		}
	}
	return ds, nil
}

func (s *oneShotSubscriber) Close() error { return nil }

// TestRedeliveryIsNotAppliedOnReceive: a delivery the broker says it
// delivered before (FirstDelivery false: it may have killed the consumer on
// receive) is stored for the workers, whose claim counts the attempt; only
// first deliveries are applied on receive. Applying redeliveries on receive
// would let a message that kills the process do so forever, never counted.
func TestRedeliveryIsNotAppliedOnReceive(t *testing.T) {
	t.Parallel()
	for _, first := range []bool{true, false} {
		b := setup(t)
		order := fmt.Sprintf("o-%v", first)
		payload, err := json.Marshal(ledger.OrderCreated{OrderID: order, CustomerID: "c", AmountCents: 300, Currency: "EUR"})
		require.NoError(t, err)
		var acked atomic.Bool
		sub := &oneShotSubscriber{ds: []broker.Delivery{{
			Message: pgrelay.Message{EventID: "created-" + order, Topic: "orders", Key: order,
				EventType: ledger.EventOrderCreated, Payload: payload, OccurredAt: time.Now()},
			Ref:           "test",
			FirstDelivery: first,
			Ack:           func(context.Context) error { acked.Store(true); return nil },
			InProgress:    func(context.Context) error { return nil },
		}}}
		cfg := b.cfg
		cfg.Subscribe = func(context.Context) (broker.Subscriber, error) { return sub, nil }
		c, err := newConsumer(cfg)
		require.NoError(t, err)
		stop := b.start(t, c)
		require.Eventually(t, func() bool {
			var st string
			err := b.pool.QueryRow(context.Background(), `SELECT status FROM pgrelay.inbox WHERE event_id = $1`, "created-"+order).Scan(&st)
			return err == nil && st == "processed" && acked.Load()
		}, 10*time.Second, 10*time.Millisecond)
		require.NoError(t, stop())
		var attempts int
		require.NoError(t, b.pool.QueryRow(context.Background(),
			`SELECT attempts FROM pgrelay.inbox WHERE event_id = $1`, "created-"+order).Scan(&attempts))
		require.Equal(t, 1, attempts)
		if first {
			require.EqualValues(t, 1, c.Stats().AppliedOnReceive, "a first delivery is applied on receive")
		} else {
			require.Zero(t, c.Stats().AppliedOnReceive, "a redelivery must be left to the workers' counted claims")
		}
	}
}

// orderCreated is a delivery of an OrderCreated event for order (event id
// "created-"+order) that counts its acknowledgement in acked.
func orderCreated(t *testing.T, order string, first bool, acked *atomic.Int64) broker.Delivery {
	t.Helper()
	payload, err := json.Marshal(ledger.OrderCreated{OrderID: order, CustomerID: "c", AmountCents: 100, Currency: "EUR"})
	require.NoError(t, err)
	return broker.Delivery{
		Message: pgrelay.Message{EventID: "created-" + order, Topic: "orders", Key: order,
			EventType: ledger.EventOrderCreated, Payload: payload, OccurredAt: time.Now()},
		Ref:           "test",
		FirstDelivery: first,
		Ack:           func(context.Context) error { acked.Add(1); return nil },
		InProgress:    func(context.Context) error { return nil },
	}
}

// TestFullFetchIsAppliedOnReceive: a fetch that fills a whole batch (a burst,
// a producer committing many events at once) is applied on receive too:
// stored pending it would be written three times
// (insert, claim, mark) instead of once, and every claim and mark leaves dead
// tuples behind under a held xmin horizon.
func TestFullFetchIsAppliedOnReceive(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 4
	var acked atomic.Int64
	ds := make([]broker.Delivery, n)
	for i := range ds {
		ds[i] = orderCreated(t, fmt.Sprintf("full-%d", i), true, &acked)
	}
	sub := &oneShotSubscriber{ds: ds}
	cfg := b.cfg
	cfg.FetchBatchSize = n // the fetch fills its batch
	cfg.Subscribe = func(context.Context) (broker.Subscriber, error) { return sub, nil }
	c, err := newConsumer(cfg)
	require.NoError(t, err)
	stop := b.start(t, c)
	require.Eventually(t, func() bool { return acked.Load() == n }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, stop())
	require.EqualValues(t, n, c.Stats().AppliedOnReceive, "a full fetch must be applied on receive")
	var processed int
	require.NoError(t, b.pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pgrelay.inbox WHERE status = 'processed' AND attempts = 1 AND starts_with(event_id, 'created-full-')`).Scan(&processed))
	require.Equal(t, n, processed)
}

// TestApplyOnReceiveWhileWorkersAreBusy: first deliveries are applied on
// receive even while a worker is processing rows left pending (here a
// redelivery whose handler blocks). Deciding by the workers' state made the
// pending path sticky under load: once a worker was busy, every fetch was
// stored pending, each event written three times and, under a held xmin
// horizon, claimed through dead tuples.
func TestApplyOnReceiveWhileWorkersAreBusy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	blocked, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	b.cfg.Inbox.Handler = pgrelay.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
		if ev.EventID == "created-slow" {
			once.Do(func() { close(blocked) })
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return (ledger.Handler{}).Handle(ctx, tx, ev)
	})
	var acked atomic.Int64
	sub := &queueSubscriber{}
	sub.push(orderCreated(t, "slow", false, &acked)) // a redelivery: stored pending, a worker runs it
	cfg := b.cfg
	cfg.Subscribe = func(context.Context) (broker.Subscriber, error) { return sub, nil }
	c, err := newConsumer(cfg)
	require.NoError(t, err)
	stop := b.start(t, c)
	select {
	case <-blocked:
	case <-time.After(10 * time.Second):
		t.Fatal("no worker ran the redelivered event")
	}
	const n = 3
	var fresh []broker.Delivery
	for i := range n {
		fresh = append(fresh, orderCreated(t, fmt.Sprintf("fresh-%d", i), true, &acked))
	}
	sub.push(fresh...)
	require.Eventually(t, func() bool { return acked.Load() == n+1 }, 10*time.Second, 5*time.Millisecond)
	require.EqualValues(t, n, c.Stats().AppliedOnReceive, "first deliveries must be applied on receive while a worker is busy")
	close(release)
	require.Eventually(t, func() bool {
		var processed int
		err := b.pool.QueryRow(context.Background(),
			`SELECT count(*) FROM pgrelay.inbox WHERE status = 'processed' AND starts_with(event_id, 'created-')`).Scan(&processed)
		return err == nil && processed == n+1
	}, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, stop())
}
