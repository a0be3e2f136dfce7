package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	pgnats "github.com/pgrelay/pgrelay/broker/nats"
	"github.com/pgrelay/pgrelay/internal/db"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/ledger"
	"github.com/pgrelay/pgrelay/internal/logtest"
	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/internal/testnats"
)

type testBundle struct {
	pool   *pgxpool.Pool
	js     jetstream.JetStream
	stream string
	prefix string
	cfg    Config
	// nats configures the NATS subscriber config() gives the consumer.
	nats pgnats.Config
}

// config returns b.cfg subscribing to NATS with b.nats.
func (b *testBundle) config() Config {
	cfg, nc := b.cfg, b.nats
	cfg.Subscribe = func(ctx context.Context) (broker.Subscriber, error) { return pgnats.NewSubscriber(ctx, nc) }
	return cfg
}

// deliveries returns n deliveries whose Ack and InProgress do nothing, for
// storeEach.
func deliveries(n int) []broker.Delivery {
	ds := make([]broker.Delivery, n)
	for i := range ds {
		ds[i].Ack = func(context.Context) error { return nil }
		ds[i].InProgress = func(context.Context) error { return nil }
	}
	return ds
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	pool := testdb.New(t)
	url := testnats.URL(t)
	stream, prefix := testnats.Stream(t, url)
	_, js := testnats.Connect(t, url)
	return &testBundle{pool: pool, js: js, stream: stream, prefix: prefix, nats: pgnats.Config{
		URL:             url,
		Stream:          stream,
		SubjectPrefix:   prefix,
		Durable:         "test",
		AckWait:         10 * time.Second, // tests that need redeliveries lower it
		MaxAckPending:   200,
		MaxPayloadBytes: 1 << 20,
	}, cfg: Config{
		Pool:           pool,
		FetchBatchSize: 20,
		MaxWait:        100 * time.Millisecond,
		RetryMin:       10 * time.Millisecond,
		RetryMax:       200 * time.Millisecond,
		StatsInterval:  -1,
		Inbox: pgrelay.InboxConfig{
			Handler:       ledger.Handler{},
			PollInterval:  50 * time.Millisecond,
			BackoffMin:    10 * time.Millisecond,
			BackoffMax:    100 * time.Millisecond,
			DeferFallback: 200 * time.Millisecond,
		},
		Logger: logtest.New(t),
	}}
}

// publish sends one event the way the relay does.
func (b *testBundle) publish(t *testing.T, id, msgID, eventType string, payload any) {
	t.Helper()
	data, err := json.Marshal(payload)
	require.NoError(t, err)
	m := nats.NewMsg(b.prefix + ".orders")
	m.Data = data
	m.Header.Set(pgnats.MsgIDHeader, msgID)
	m.Header.Set(event.HeaderEventID, id)
	m.Header.Set(event.HeaderEventType, eventType)
	m.Header.Set(event.HeaderTopic, "orders")
	m.Header.Set(event.HeaderOccurredAt, time.Now().UTC().Format(time.RFC3339Nano))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = b.js.PublishMsg(ctx, m)
	require.NoError(t, err)
}

// publishOrders publishes n OrderCreated and n OrderPaid events and returns
// the total credited.
func (b *testBundle) publishOrders(t *testing.T, n int) int64 {
	var total int64
	for i := range n {
		order := fmt.Sprintf("o-%d", i)
		amount := int64(100 + i)
		total += amount
		b.publish(t, "created-"+order, "created-"+order, ledger.EventOrderCreated,
			ledger.OrderCreated{OrderID: order, CustomerID: "c", AmountCents: amount, Currency: "EUR"})
		b.publish(t, "paid-"+order, "paid-"+order, ledger.EventOrderPaid,
			ledger.OrderPaid{OrderID: order, AmountCents: amount, Currency: "EUR"})
	}
	return total
}

func (b *testBundle) start(t *testing.T, c *Consumer) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.consume(ctx) }()
	var stopped bool
	stop = func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(30 * time.Second):
			return fmt.Errorf("consumer did not stop within 30s")
		}
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// settled reports whether the ledger holds want entries worth total, the
// inbox has rows inbox rows all processed, and JetStream has nothing left
// unacknowledged.
func (b *testBundle) settled(t *testing.T, entries, total int64, rows int) func() bool {
	return func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		tot, err := db.New().LedgerTotals(ctx, b.pool)
		if err != nil || tot.Entries != entries || tot.TotalCents != total {
			return false
		}
		var n, processed int
		if err := b.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE status = 'processed') FROM pgrelay.inbox`).Scan(&n, &processed); err != nil {
			return false
		}
		if n != rows || processed != rows {
			return false
		}
		cons, err := b.js.Consumer(ctx, b.stream, b.nats.Durable)
		if err != nil {
			return false
		}
		info, err := cons.Info(ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	}
}

// TestCrashBetweenCommitAndAck abandons batches after their inbox commit and
// before their acknowledgement, as a crash would: JetStream redelivers them,
// the inbox absorbs the redeliveries, and every order is credited once.
func TestCrashBetweenCommitAndAck(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const orders = 60
	total := b.publishOrders(t, orders)

	b.nats.AckWait = time.Second
	c, err := newConsumer(b.config())
	require.NoError(t, err)
	var crashes atomic.Int32
	c.crashAfterCommit = func() bool { return crashes.Add(1) <= 3 }
	stop := b.start(t, c)

	require.Eventually(t, b.settled(t, orders, total, 2*orders), 30*time.Second, 50*time.Millisecond)
	require.NoError(t, stop())
	s := c.Stats()
	require.Positive(t, s.Duplicates, "abandoned batches were redelivered and absorbed")
	require.Equal(t, int64(2*orders), s.Inserted)
	require.Equal(t, s.Fetched, s.Inserted+s.Duplicates, "every fetched message was stored or recognised as a duplicate")
}

// TestDuplicatesAbsorbed delivers every event twice through JetStream (the
// second copy under another broker message id, so the broker cannot drop it):
// the inbox stores each once and the ledger credits each order once.
func TestDuplicatesAbsorbed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const orders = 30
	total := b.publishOrders(t, orders)
	for i := range orders {
		order := fmt.Sprintf("o-%d", i)
		b.publish(t, "paid-"+order, "again-paid-"+order, ledger.EventOrderPaid,
			ledger.OrderPaid{OrderID: order, AmountCents: int64(100 + i), Currency: "EUR"})
	}
	c, err := newConsumer(b.config())
	require.NoError(t, err)
	stop := b.start(t, c)
	require.Eventually(t, b.settled(t, orders, total, 2*orders), 30*time.Second, 50*time.Millisecond)
	require.NoError(t, stop())
	require.GreaterOrEqual(t, c.Stats().Duplicates, int64(orders))
}

// TestGracefulStop cancels a running consumer: Run returns nil promptly and
// leaves nothing it fetched unacknowledged.
func TestGracefulStop(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, err := newConsumer(b.config())
	require.NoError(t, err)
	stop := b.start(t, c)
	require.Eventually(t, c.Ready, 10*time.Second, 10*time.Millisecond)
	total := b.publishOrders(t, 5)
	require.Eventually(t, b.settled(t, 5, total, 10), 30*time.Second, 50*time.Millisecond)
	start := time.Now()
	require.NoError(t, stop())
	require.Less(t, time.Since(start), 15*time.Second)
	require.False(t, c.Ready())
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	_, err := newConsumer(Config{})
	require.ErrorContains(t, err, "Config.Pool is required")
	require.ErrorContains(t, err, "Config.Subscribe is required")
	require.ErrorContains(t, err, "Config.Inbox.Handler is required")

	pool := &pgxpool.Pool{}
	sub := func(context.Context) (broker.Subscriber, error) { return nil, nil }
	_, err = newConsumer(Config{Pool: pool, Subscribe: sub, disableWorkers: true, FetchBatchSize: 20000})
	require.ErrorContains(t, err, "consumer.Config.FetchBatchSize 20000 must be between 1 and 10000")
	_, err = newConsumer(Config{Pool: pool, Subscribe: sub, disableWorkers: true, MaxWait: time.Millisecond})
	require.ErrorContains(t, err, "Config.MaxWait")
	for _, bad := range []float64{-0.1, 1.5, math.NaN()} {
		_, err = newConsumer(Config{Pool: pool, Subscribe: sub, disableWorkers: true, DupRateWarn: bad})
		require.ErrorContains(t, err, "Config.DupRateWarn")
	}
	_, err = newConsumer(Config{Pool: pool, Subscribe: sub, disableWorkers: true, DupRateWarn: 1})
	require.NoError(t, err)

	// Direct: no subscriber, and workers to run.
	handler := pgrelay.HandlerFunc(func(context.Context, pgx.Tx, *pgrelay.InboxEvent) error { return nil })
	_, err = newConsumer(Config{Pool: pool, Direct: true, Subscribe: sub, Inbox: pgrelay.InboxConfig{Handler: handler}})
	require.ErrorContains(t, err, "consumer.Config.Subscribe must be nil with consumer.Config.Direct")
	register := func(context.Context) error { return nil }
	_, err = newConsumer(Config{Pool: pool, Direct: true, Register: register, disableWorkers: true})
	require.ErrorContains(t, err, "consumer.Config.Direct without the workers would run nothing")
	// Direct without Register: nothing would record the handlers for the
	// relay, which stores nothing for them.
	_, err = newConsumer(Config{Pool: pool, Direct: true, Inbox: pgrelay.InboxConfig{Handler: handler}})
	require.ErrorContains(t, err, "consumer.Config.Register is required with consumer.Config.Direct: postgres.RegisterTargets")
	_, err = newConsumer(Config{Pool: pool, Subscribe: sub, Register: register, Inbox: pgrelay.InboxConfig{Handler: handler}})
	require.ErrorContains(t, err, "consumer.Config.Register is set without consumer.Config.Direct")
	_, err = newConsumer(Config{Pool: pool, Direct: true, Register: register, Inbox: pgrelay.InboxConfig{Handler: handler}})
	require.NoError(t, err)
}

// TestReconnects restarts the NATS server (same port and store) and drops
// every database connection mid-run: the consumer retries with backoff and
// every order is still credited exactly once.
func TestReconnects(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	srv := testnats.Start(t, dir, -1)
	url := srv.ClientURL()
	port := srv.Addr().(*net.TCPAddr).Port
	b := setup(t)
	b.nats.URL = url
	b.stream, b.prefix = testnats.Stream(t, url)
	b.nats.Stream, b.nats.SubjectPrefix = b.stream, b.prefix
	nc, js := testnats.Connect(t, url)
	b.js = js

	c, err := newConsumer(b.config())
	require.NoError(t, err)
	b.start(t, c)
	require.Eventually(t, c.Ready, 10*time.Second, 10*time.Millisecond)
	total := b.publishOrders(t, 10)
	require.Eventually(t, b.settled(t, 10, total, 20), 30*time.Second, 50*time.Millisecond)

	// The broker goes away and comes back with its data.
	srv.Shutdown()
	srv.WaitForShutdown()
	testnats.Start(t, dir, port)
	require.Eventually(t, nc.IsConnected, 10*time.Second, 10*time.Millisecond)

	// Every database connection is dropped.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = b.pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid()`)
	require.NoError(t, err)

	var more int64
	for i := 10; i < 20; i++ {
		order := fmt.Sprintf("o-%d", i)
		amount := int64(100 + i)
		more += amount
		b.publish(t, "created-"+order, "created-"+order, ledger.EventOrderCreated,
			ledger.OrderCreated{OrderID: order, CustomerID: "c", AmountCents: amount, Currency: "EUR"})
		b.publish(t, "paid-"+order, "paid-"+order, ledger.EventOrderPaid,
			ledger.OrderPaid{OrderID: order, AmountCents: amount, Currency: "EUR"})
	}
	require.Eventually(t, b.settled(t, 20, total+more, 40), 60*time.Second, 50*time.Millisecond)
}

// TestReattachesAfterDurableDeleted deletes the durable consumer under a
// running consumer: it attaches again (the new durable starts from the
// beginning of the stream, and the inbox absorbs the replay) and keeps going.
func TestReattachesAfterDurableDeleted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, err := newConsumer(b.config())
	require.NoError(t, err)
	b.start(t, c)
	require.Eventually(t, c.Ready, 10*time.Second, 10*time.Millisecond)
	total := b.publishOrders(t, 5)
	require.Eventually(t, b.settled(t, 5, total, 10), 30*time.Second, 50*time.Millisecond)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, b.js.DeleteConsumer(ctx, b.stream, b.nats.Durable))
	b.publish(t, "created-late", "created-late", ledger.EventOrderCreated,
		ledger.OrderCreated{OrderID: "late", CustomerID: "c", AmountCents: 7, Currency: "EUR"})
	b.publish(t, "paid-late", "paid-late", ledger.EventOrderPaid,
		ledger.OrderPaid{OrderID: "late", AmountCents: 7, Currency: "EUR"})
	require.Eventually(t, b.settled(t, 6, total+7, 12), 30*time.Second, 50*time.Millisecond)
	require.GreaterOrEqual(t, c.Stats().Duplicates, int64(10), "the replayed stream was absorbed")
}

// TestNoIDRedeliveryDedups abandons the batch holding a message without any
// event id after its commit: the redelivery gets the same stream-sequence id
// and is absorbed, so the message is stored dead exactly once.
func TestNoIDRedeliveryDedups(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m := nats.NewMsg(b.prefix + ".orders")
	m.Header.Set(event.HeaderEventType, ledger.EventOrderPaid)
	m.Data = []byte(`{"order_id":"x"}`)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ack, err := b.js.PublishMsg(ctx, m)
	require.NoError(t, err)

	b.nats.AckWait = time.Second
	c, err := newConsumer(b.config())
	require.NoError(t, err)
	var crashes atomic.Int32
	c.crashAfterCommit = func() bool { return crashes.Add(1) == 1 }
	b.start(t, c)
	require.Eventually(t, func() bool { return c.Stats().Duplicates >= 1 && c.Stats().Acked >= 1 },
		30*time.Second, 20*time.Millisecond, "the redelivery was absorbed and acknowledged")
	var id, reason string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT event_id, last_error FROM pgrelay.inbox WHERE status = 'dead'`).Scan(&id, &reason))
	require.Equal(t, pgnats.FallbackEventID(b.stream, b.created(t), ack.Sequence), id)
	require.Contains(t, reason, broker.ReasonMissingEventID)
	var rows int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM pgrelay.inbox`).Scan(&rows))
	require.Equal(t, 1, rows)
}

// TestStoreEachIsolatesARefusedMessage stores a batch that the inbox refuses
// because of one message: the others are stored as they are, the refused one
// is stored dead with the refusal as its reason, and nothing is left out.
func TestStoreEachIsolatesARefusedMessage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, err := newConsumer(b.config())
	require.NoError(t, err)
	msg := func(id, topic string) pgrelay.Incoming {
		return pgrelay.Incoming{Message: pgrelay.Message{EventID: id, Topic: topic, EventType: "T", Payload: []byte("raw"), OccurredAt: time.Now()}}
	}
	batch := []pgrelay.Incoming{msg("a", "orders"), msg("b", "bad\x00topic"), msg("c", "orders")}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = c.store(ctx, batch, false, nil)
	require.True(t, isRefused(err), "the batch is refused as a whole: %v", err)
	out := c.storeEach(ctx, ctx, batch, deliveries(len(batch)), nil)
	for _, in := range out {
		require.NotEmpty(t, in.EventID, "every message was stored and may be acknowledged")
	}
	var status, reason, topic, eventType string
	var payload []byte
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT status, coalesce(last_error, ''), payload, topic, event_type FROM pgrelay.inbox WHERE event_id = 'b'`).
		Scan(&status, &reason, &payload, &topic, &eventType))
	require.Equal(t, "dead", status)
	require.Contains(t, reason, "refused at ingest")
	require.Equal(t, []byte("raw"), payload)
	require.Equal(t, "bad\uFFFDtopic", topic, "the dead row keeps its fields, made storable")
	require.Equal(t, "T", eventType)
	var pending int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM pgrelay.inbox WHERE event_id IN ('a', 'c') AND status <> 'dead'`).Scan(&pending))
	require.Equal(t, 2, pending)
}

// TestTransientFailureAfterRefusalIsNotDead: a batch is refused as data, and
// while its messages are stored one by one the database connection of a good
// message's store is terminated (as a failover or restart would). The good
// message must not be dead-lettered: it is retried and stored as it is, with
// every field.
func TestTransientFailureAfterRefusalIsNotDead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// The consumer gets a pool of its own, so that terminating its
	// connections leaves the test's pool alone.
	pcfg := b.pool.Config().Copy()
	pcfg.ConnConfig.RuntimeParams["application_name"] = "consumer-under-test"
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	b.cfg.Pool, b.cfg.disableWorkers = pool, true
	c, err := newConsumer(b.config())
	require.NoError(t, err)

	var terminated atomic.Bool
	c.beforeStore = func(in []pgrelay.Incoming) {
		if len(in) != 1 || in[0].EventID != "good" || !terminated.CompareAndSwap(false, true) {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := b.pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'consumer-under-test'`)
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			var n int
			_ = b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND application_name = 'consumer-under-test'`).Scan(&n)
			return n == 0
		}, 5*time.Second, 10*time.Millisecond)
	}
	good := pgrelay.Incoming{Message: pgrelay.Message{EventID: "good", Topic: "orders", Key: "o-1", EventType: "OrderCreated",
		Payload: []byte(`{}`), Headers: map[string]string{"trace": "t-1"}, OccurredAt: time.Now()}}
	bad := pgrelay.Incoming{Message: pgrelay.Message{EventID: "bad", Topic: "orders", Key: "k\x00", EventType: "T", Payload: []byte("raw")}}
	batch := []pgrelay.Incoming{bad, good}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.True(t, isRefused(c.store(ctx, batch, false, nil)), "the batch is refused as a whole")
	out := c.storeEach(ctx, ctx, batch, deliveries(len(batch)), nil)
	require.True(t, terminated.Load(), "the good message's store met a terminated connection")
	// The bad message's refusal, and the good message's store on the
	// terminated connection.
	require.GreaterOrEqual(t, c.Stats().StoreErrors, int64(2), "the good message's first store must have failed")
	require.Equal(t, "good", out[1].EventID, "the good message was stored and may be acknowledged")

	var status, topic, key, eventType, headers string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT status, topic, key, event_type, headers::text FROM pgrelay.inbox WHERE event_id = 'good'`).
		Scan(&status, &topic, &key, &eventType, &headers))
	require.Equal(t, "pending", status, "a transient failure must not dead-letter a good message")
	require.Equal(t, []string{"orders", "o-1", "OrderCreated"}, []string{topic, key, eventType})
	require.JSONEq(t, `{"trace": "t-1"}`, headers)
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT status, key FROM pgrelay.inbox WHERE event_id = 'bad'`).Scan(&status, &key))
	require.Equal(t, "dead", status)
	require.Equal(t, "k\uFFFD", key, "the refused message keeps its key, made storable")
}

// TestStopFinishesBatchInHand stops the consumer between a batch's commit and
// its acknowledgement: the stop is graceful, so the batch is still
// acknowledged before Run returns. (Messages received and not fetched are
// handed back on the stop, for redelivery.)
func TestStopFinishesBatchInHand(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.publishOrders(t, 5)
	c, err := newConsumer(b.config())
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var once atomic.Bool
	c.crashAfterCommit = func() bool {
		if once.CompareAndSwap(false, true) {
			cancel() // SIGTERM arrives while the batch is in hand
		}
		return false
	}
	require.NoError(t, c.consume(ctx))
	s := c.Stats()
	require.Positive(t, s.Fetched)
	require.Equal(t, s.Fetched, s.Acked, "the batch in hand was acknowledged")

	ictx, icancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer icancel()
	cons, err := b.js.Consumer(ictx, b.stream, b.nats.Durable)
	require.NoError(t, err)
	info, err := cons.Info(ictx)
	require.NoError(t, err)
	// The batches in hand were the stream's first messages, in order.
	require.Equal(t, uint64(s.Acked), info.AckFloor.Stream, "every acknowledgement reached the server before Run returned")
}

// TestShortFetchWaitStrandsNothing publishes while the consumer fetches with a
// very short wait: every message is stored and acknowledged promptly. A fetch
// that gave up on the client before the server expired the pull request would
// leave the messages delivered in between unacknowledged until AckWait.
func TestShortFetchWaitStrandsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.cfg.MaxWait = 10 * time.Millisecond
	b.nats.AckWait = time.Minute
	c, err := newConsumer(b.config())
	require.NoError(t, err)
	b.start(t, c)

	const orders = 150
	total := b.publishOrders(t, orders)
	require.Eventually(t, b.settled(t, orders, total, 2*orders), 20*time.Second, 50*time.Millisecond,
		"messages must not wait for AckWait (%s) to be redelivered", b.nats.AckWait)
}

// TestLoneMessageIsNotHeldForABatch: with a long MaxWait and a batch far
// larger than the traffic, a single message is stored as soon as it arrives,
// not when the fetch's wait for a full batch runs out.
func TestLoneMessageIsNotHeldForABatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.cfg.MaxWait = 6 * time.Second
	c, err := newConsumer(b.config())
	require.NoError(t, err)
	b.start(t, c)

	total := b.publishOrders(t, 1)
	require.Eventually(t, b.settled(t, 1, total, 2), 3*time.Second, 20*time.Millisecond,
		"a lone message must not wait for MaxWait (%s)", b.cfg.MaxWait)
}

// streamWithMaxAge creates a stream of its own with the given MaxAge (zero:
// no limit), deleted when the test ends, and points b at it.
func (b *testBundle) streamWithMaxAge(t *testing.T, maxAge time.Duration) {
	t.Helper()
	b.stream, b.prefix = b.stream+"X", b.prefix+"x"
	b.nats.Stream, b.nats.SubjectPrefix, b.nats.FilterSubject = b.stream, b.prefix, ""
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := b.js.CreateStream(ctx, jetstream.StreamConfig{Name: b.stream, Subjects: []string{b.prefix + ".>"},
		Storage: jetstream.FileStorage, MaxAge: maxAge})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.js.DeleteStream(context.Background(), b.stream) })
}

// TestStreamOutlivingDedupWindowRefused: a stream without an age limit (or
// one longer than the dedup window) could replay an event after retention
// deleted its inbox row, so the consumer refuses to start, naming both values
// and the override; with the override it runs.
func TestStreamOutlivingDedupWindowRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.streamWithMaxAge(t, 0)
	for _, window := range []time.Duration{0, time.Hour} {
		b.nats.DedupWindow = window
		c, err := newConsumer(b.config())
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err = c.consume(ctx)
		cancel()
		require.Error(t, err, "the consumer must refuse the stream")
		var rw *pgnats.ReplayWindowError
		require.ErrorAs(t, err, &rw)
		require.ErrorContains(t, err, "MaxAge unlimited")
		want := window
		if want == 0 {
			want = 7 * 24 * time.Hour
		}
		require.ErrorContains(t, err, "nats.Config.DedupWindow "+want.String())
		require.ErrorContains(t, err, "nats.Config.AllowReplayBeyondDedupWindow")
	}

	b.nats.DedupWindow, b.nats.AllowReplayBeyondDedupWindow = 0, true
	c, err := newConsumer(b.config())
	require.NoError(t, err)
	b.start(t, c)
	require.Eventually(t, c.Ready, 10*time.Second, 10*time.Millisecond, "allowed explicitly, it runs")
}

// TestLostDurableReplaysNothingPastTheWindow: a non-idempotent handler (one
// effect row per call, no unique key), three events processed, their inbox
// rows deleted by retention once the dedup window passed, then the durable
// consumer deleted. The consumer re-creates it delivering from now minus the
// window, so the three events are not applied again; an event published
// afterwards is.
func TestLostDurableReplaysNothingPastTheWindow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.streamWithMaxAge(t, 0)
	// The window must outlast the subscriber's notice of the lost durable (an
	// idle subscriber checks every 5 s): it re-creates the durable delivering
	// from now minus the window, which must still cover the event published
	// right after the loss.
	const window = 10 * time.Second
	b.nats.DedupWindow, b.nats.AllowReplayBeyondDedupWindow = window, true
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err := b.pool.Exec(ctx, `CREATE TABLE effects (event_id text NOT NULL)`)
	require.NoError(t, err)
	b.cfg.Inbox.Handler = pgrelay.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (event_id) VALUES ($1)`, ev.EventID)
		return err
	})
	effects := func() map[string]int {
		got := map[string]int{}
		rows, err := b.pool.Query(ctx, `SELECT event_id, count(*) FROM effects GROUP BY 1`)
		require.NoError(t, err)
		for rows.Next() {
			var id string
			var n int
			require.NoError(t, rows.Scan(&id, &n))
			got[id] = n
		}
		require.NoError(t, rows.Err())
		return got
	}
	c, err := newConsumer(b.config())
	require.NoError(t, err)
	b.start(t, c)
	for i := range 3 {
		id := fmt.Sprintf("e-%d", i)
		b.publish(t, id, id, "Anything", map[string]int{"n": i})
	}
	require.Eventually(t, func() bool { return len(effects()) == 3 }, 30*time.Second, 20*time.Millisecond)

	// Retention, once the window has passed: the processed rows go.
	require.Eventually(t, func() bool {
		_, err := b.pool.Exec(ctx, `DELETE FROM pgrelay.inbox WHERE status = 'processed' AND finished_at < now() - make_interval(secs => $1)`, window.Seconds())
		require.NoError(t, err)
		var left int
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM pgrelay.inbox`).Scan(&left))
		return left == 0
	}, 30*time.Second, 100*time.Millisecond)

	// The durable consumer is lost. (The server can refuse a delete that
	// races its own write of the consumer's state: "directory not empty".)
	require.Eventually(t, func() bool {
		err := b.js.DeleteConsumer(ctx, b.stream, b.nats.Durable)
		return err == nil || errors.Is(err, jetstream.ErrConsumerNotFound)
	}, 10*time.Second, 50*time.Millisecond)
	b.publish(t, "after", "after", "Anything", map[string]int{"n": 9})
	require.Eventually(t, func() bool { return effects()["after"] == 1 }, 30*time.Second, 20*time.Millisecond)
	require.Equal(t, map[string]int{"e-0": 1, "e-1": 1, "e-2": 1, "after": 1}, effects(),
		"events older than the dedup window must not be applied again")
}

// TestCreateStreamWithTheRelaysSettings: a stream the consumer creates has the
// relay's settings, and a MaxAge within the dedup window.
func TestCreateStreamWithTheRelaysSettings(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.stream, b.prefix = b.stream+"C", b.prefix+"c"
	b.nats.Stream, b.nats.SubjectPrefix, b.nats.FilterSubject = b.stream, b.prefix, ""
	b.nats.CreateStream, b.nats.DedupWindow = true, 2*time.Hour
	t.Cleanup(func() { _ = b.js.DeleteStream(context.Background(), b.stream) })
	c, err := newConsumer(b.config())
	require.NoError(t, err)
	b.start(t, c)
	require.Eventually(t, c.Ready, 10*time.Second, 10*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := b.js.Stream(ctx, b.stream)
	require.NoError(t, err)
	want := pgnats.StreamSpec{Name: b.stream, SubjectPrefix: b.prefix, MaxAge: 2 * time.Hour}.Config()
	got := s.CachedInfo().Config
	require.Equal(t, want.MaxAge, got.MaxAge)
	require.Equal(t, want.Duplicates, got.Duplicates)
	require.Equal(t, want.Subjects, got.Subjects)
}

// created returns the creation time of the test's stream.
func (b *testBundle) created(t *testing.T) time.Time {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := b.js.Stream(ctx, b.stream)
	require.NoError(t, err)
	return s.CachedInfo().Created
}

// TestFallbackIDsOfARecreatedStreamAreNew: a message without an event id is
// stored dead under an id derived from its stream position. After the stream
// is deleted and created again (sequence numbers restart at 1), a new such
// message must be stored as a new dead row, not absorbed as a duplicate of the
// old one.
func TestFallbackIDsOfARecreatedStreamAreNew(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	publishNoID := func(body string) {
		m := nats.NewMsg(b.prefix + ".orders")
		m.Header.Set(event.HeaderEventType, ledger.EventOrderPaid)
		m.Data = []byte(body)
		ack, err := b.js.PublishMsg(ctx, m)
		require.NoError(t, err)
		require.Equal(t, uint64(1), ack.Sequence)
	}
	dead := func() int {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM pgrelay.inbox WHERE status = 'dead'`).Scan(&n))
		return n
	}
	publishNoID(`{"first":true}`)
	c, err := newConsumer(b.config())
	require.NoError(t, err)
	stop := b.start(t, c)
	require.Eventually(t, func() bool { return dead() == 1 }, 30*time.Second, 20*time.Millisecond)
	require.NoError(t, stop())

	// The stream is re-created under the same name.
	info, err := b.js.Stream(ctx, b.stream)
	require.NoError(t, err)
	require.NoError(t, b.js.DeleteStream(ctx, b.stream))
	_, err = b.js.CreateStream(ctx, info.CachedInfo().Config)
	require.NoError(t, err)
	publishNoID(`{"second":true}`)

	c, err = newConsumer(b.config())
	require.NoError(t, err)
	b.start(t, c)
	require.Eventually(t, func() bool { return dead() == 2 }, 30*time.Second, 20*time.Millisecond,
		"the new message must not be taken for a duplicate of the old one")
	var payloads []string
	rows, err := b.pool.Query(ctx, `SELECT convert_from(payload, 'UTF8') FROM pgrelay.inbox ORDER BY received_at`)
	require.NoError(t, err)
	for rows.Next() {
		var p string
		require.NoError(t, rows.Scan(&p))
		payloads = append(payloads, p)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{`{"first":true}`, `{"second":true}`}, payloads)
}

// TestDuplicateLogLinesHitRatioAndReceiveTiming delivers four events, then
// redeliveries of three of them under new broker ids, through JetStream into
// the real inbox: each absorbed redelivery is logged at debug as "duplicate
// blocked" with its event id, the interval made of duplicates only crosses
// DupRateWarn and logs "high duplicate rate" at warn with the hit ratio
// DedupHitRatio reports, and every Receive statement is timed.
func TestDuplicateLogLinesHitRatioAndReceiveTiming(t *testing.T) {
	t.Parallel()
	b := setup(t)
	core, logs := logtest.Observe(slog.LevelDebug)
	b.cfg.Logger = core
	// The test closes the rate intervals itself; the watcher's own ticker
	// never fires.
	b.cfg.rateInterval = time.Hour
	b.cfg.DupRateWarn = 0.5
	var receives atomic.Int64
	b.cfg.observeReceive = func(d time.Duration) {
		if d > 0 {
			receives.Add(1)
		}
	}
	c, err := newConsumer(b.config())
	require.NoError(t, err)
	b.start(t, c)
	for i := range 4 {
		b.publish(t, fmt.Sprintf("e-%d", i), fmt.Sprintf("m-%d", i), "Unknown", map[string]any{})
	}
	require.Eventually(t, func() bool { return c.Stats().Inserted == 4 }, 30*time.Second, 20*time.Millisecond)
	c.closeRateInterval() // the redeliveries get an interval to themselves
	require.Zero(t, logs.FilterMessage("high duplicate rate").Len(), "an interval of new events only")
	for i := range 3 {
		b.publish(t, fmt.Sprintf("e-%d", i), fmt.Sprintf("again-%d", i), "Unknown", map[string]any{})
	}
	require.Eventually(t, func() bool { return c.Stats().Duplicates == 3 }, 30*time.Second, 10*time.Millisecond)
	c.closeRateInterval()
	require.Equal(t, 1, logs.FilterMessage("high duplicate rate").Len(), "no high duplicate rate warning")

	blocked := logs.FilterMessage("duplicate blocked").All()
	require.Len(t, blocked, 3)
	var ids []string
	for _, e := range blocked {
		require.Equal(t, slog.LevelDebug, e.Level)
		ids = append(ids, e.ContextMap()["event_id"].(string))
	}
	require.ElementsMatch(t, []string{"e-0", "e-1", "e-2"}, ids)

	warn := logs.FilterMessage("high duplicate rate").All()[0]
	require.Equal(t, slog.LevelWarn, warn.Level)
	require.InDelta(t, 1.0, warn.ContextMap()["rate"], 1e-9)
	require.InDelta(t, 0.5, warn.ContextMap()["threshold"], 1e-9)
	// Quiet intervals follow: the ratio stays the last one measured.
	c.closeRateInterval()
	c.closeRateInterval()
	require.Equal(t, 1.0, c.dedupHitRatio(), "DedupHitRatio does not report the all-duplicates interval")
	require.GreaterOrEqual(t, receives.Load(), int64(2), "Receive statements not timed")
}

// TestDupRateWarnDisabledAtZero: with DupRateWarn 0 an all-duplicates interval
// logs no warning.
func TestDupRateWarnDisabledAtZero(t *testing.T) {
	t.Parallel()
	b := setup(t)
	core, logs := logtest.Observe(slog.LevelDebug)
	b.cfg.Logger = core
	b.cfg.rateInterval = time.Hour // the test closes the intervals itself
	c, err := newConsumer(b.config())
	require.NoError(t, err)
	b.start(t, c)
	b.publish(t, "e-0", "m-0", "Unknown", map[string]any{})
	require.Eventually(t, func() bool { return c.Stats().Inserted == 1 }, 30*time.Second, 20*time.Millisecond)
	c.closeRateInterval()
	b.publish(t, "e-0", "m-0-again", "Unknown", map[string]any{})
	require.Eventually(t, func() bool { return c.Stats().Duplicates == 1 }, 30*time.Second, 20*time.Millisecond)
	c.closeRateInterval()
	require.Equal(t, 1.0, c.dedupHitRatio(), "the all-duplicates interval was closed")
	require.Zero(t, logs.FilterMessage("high duplicate rate").Len())
	require.Equal(t, 1, logs.FilterMessage("duplicate blocked").Len())
}
