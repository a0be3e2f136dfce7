package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	pgnats "github.com/pgrelay/pgrelay/broker/nats"
	"github.com/pgrelay/pgrelay/consumer"
	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/internal/testnats"
)

// TestConsumerConfigErrorsNameTheField: NewConsumer reports every bad
// setting under its ConsumerConfig name, never an internal one.
func TestConsumerConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	_, err := consumer.New(consumer.Config{})
	require.ErrorContains(t, err, "consumer.Config.Pool is required")
	require.ErrorContains(t, err, "consumer.Config.Subscribe is required")
	require.ErrorContains(t, err, "consumer.Config.Inbox.Handler is required")

	_, err = consumer.New(consumer.Config{FetchBatchSize: -1, MetricsAddr: "nonsense", DedupKey: "business:",
		AdminAddr: "0.0.0.0:9191", Inbox: pgrelay.InboxConfig{BatchSize: -3, Workers: -1, Lease: time.Second,
			Retention: pgrelay.InboxRetentionConfig{Window: time.Minute, DuplicatesMax: -1}}})
	require.ErrorContains(t, err, "consumer.Config.FetchBatchSize -1 must be between 1 and 10000")
	require.ErrorContains(t, err, "consumer.Config.Inbox.BatchSize must be between 1 and 10000, got -3")
	require.ErrorContains(t, err, "consumer.Config.Inbox.Workers must be between 1 and 1000, got -1")
	require.ErrorContains(t, err, "consumer.Config.Inbox.HandlerTimeout (10s) must be shorter than consumer.Config.Inbox.Lease (1s)")
	require.ErrorContains(t, err, `consumer.Config.MetricsAddr "nonsense"`)
	require.ErrorContains(t, err, "consumer.Config.DedupKey: ")
	require.ErrorContains(t, err, `consumer.Config.AdminToken is required: consumer.Config.AdminAddr "0.0.0.0:9191" is not a loopback address`)
	require.ErrorContains(t, err, "consumer.Config.Inbox.Retention.Window must be at least 1h0m0s, got 1m0s")
	require.ErrorContains(t, err, "consumer.Config.Inbox.Retention.DuplicatesMax must be at least 1, got -1")
	require.NotContains(t, err.Error(), " Config.")
	require.NotContains(t, err.Error(), "--", "no command-line flag named to a library user")
}

// countingBatchHandler applies events set-based and counts its calls.
type countingBatchHandler struct {
	batches, single atomic.Int64
}

func (h *countingBatchHandler) HandleBatch(ctx context.Context, tx pgx.Tx, evs []*pgrelay.InboxEvent) error {
	ids := make([]string, len(evs))
	for i, ev := range evs {
		ids[i] = ev.EventID
	}
	_, err := tx.Exec(ctx, `INSERT INTO applied (event_id, times) SELECT unnest($1::text[]), 1
		ON CONFLICT (event_id) DO UPDATE SET times = applied.times + 1`, ids)
	h.batches.Add(1)
	return err
}

func (h *countingBatchHandler) Handle(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
	h.single.Add(1)
	return h.HandleBatch(ctx, tx, []*pgrelay.InboxEvent{ev})
}

// TestConsumerRunsABatchHandler: the public consumer takes the batch form of
// a handler and applies each event once with it.
func TestConsumerRunsABatchHandler(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	natsURL := testnats.URL(t)
	stream, prefix := testnats.Stream(t, natsURL)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := pool.Exec(ctx, `CREATE TABLE applied (event_id text PRIMARY KEY, times int NOT NULL)`)
	require.NoError(t, err)

	// Stored before the consumer starts, so that its workers find them in batches.
	_, js := testnats.Connect(t, natsURL)
	const events = 60
	for i := range events {
		m := nats.NewMsg(prefix + ".orders")
		m.Header.Set("Pgrelay-Event-Id", fmt.Sprintf("e-%d", i))
		m.Header.Set("Pgrelay-Event-Type", "OrderCreated")
		m.Data = []byte(`{}`)
		_, err := js.PublishMsg(ctx, m)
		require.NoError(t, err)
	}

	h := &countingBatchHandler{}
	var handler pgrelay.InboxBatchHandler = h
	c, err := consumer.New(consumer.Config{Pool: pool, Inbox: pgrelay.InboxConfig{Handler: handler},
		Subscribe: broker.Subscribe(pgnats.NewSubscriber, pgnats.Config{URL: natsURL, Stream: stream, SubjectPrefix: prefix}),
		MaxWait:   50 * time.Millisecond, Logger: testLogger(t)})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { require.NoError(t, c.Run(runCtx)) })
	defer func() { stop(); wg.Wait() }()

	require.Eventually(t, func() bool {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM pgrelay.inbox WHERE status = 'processed'`).Scan(&n)
		return n == events
	}, 30*time.Second, 20*time.Millisecond)
	var rows, maxTimes int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), max(times) FROM applied`).Scan(&rows, &maxTimes))
	require.Equal(t, events, rows)
	require.Equal(t, 1, maxTimes)
	require.Less(t, h.batches.Load()-h.single.Load(), int64(events), "some events were applied in batches")
	require.Positive(t, h.batches.Load()-h.single.Load(), "HandleBatch ran on whole batches")
	require.True(t, c.Ready())
}

// TestConsumerTakesASubscriber: the consumer fetches from the subscriber
// Config.Subscribe creates, calling it once.
func TestConsumerTakesASubscriber(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	natsURL := testnats.URL(t)
	stream, prefix := testnats.Stream(t, natsURL)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := pool.Exec(ctx, `CREATE TABLE applied (event_id text PRIMARY KEY, times int NOT NULL)`)
	require.NoError(t, err)
	_, js := testnats.Connect(t, natsURL)
	for i := range 5 {
		m := nats.NewMsg(prefix + ".orders")
		m.Header.Set("Pgrelay-Event-Id", fmt.Sprintf("s-%d", i))
		m.Header.Set("Pgrelay-Event-Type", "OrderCreated")
		m.Data = []byte(`{}`)
		_, err := js.PublishMsg(ctx, m)
		require.NoError(t, err)
	}
	var subscribed atomic.Int32
	subscribe := broker.Subscribe(pgnats.NewSubscriber, pgnats.Config{URL: natsURL, Stream: stream, SubjectPrefix: prefix})
	c, err := consumer.New(consumer.Config{Pool: pool, Inbox: pgrelay.InboxConfig{Handler: &countingBatchHandler{}},
		MaxWait: 50 * time.Millisecond, Logger: testLogger(t),
		Subscribe: func(ctx context.Context) (broker.Subscriber, error) {
			subscribed.Add(1)
			return subscribe(ctx)
		}})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { require.NoError(t, c.Run(runCtx)) })
	defer func() { stop(); wg.Wait() }()
	require.Eventually(t, func() bool {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM applied`).Scan(&n)
		return n == 5
	}, 30*time.Second, 20*time.Millisecond)
	require.Equal(t, int32(1), subscribed.Load())
}

// TestBusyAddressNamesTheField: an operator address that cannot be bound
// stops Run with an error naming the Config field that set it (the endpoints
// name command-line flags only for the commands).
func TestBusyAddressNamesTheField(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	c, err := consumer.New(consumer.Config{Pool: pool, MetricsAddr: ln.Addr().String(), Logger: testLogger(t),
		Inbox: pgrelay.InboxConfig{Handler: &countingBatchHandler{}},
		Subscribe: func(context.Context) (broker.Subscriber, error) {
			return nil, errors.New("not reached: the endpoints start first")
		}})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = c.Run(ctx)
	require.ErrorContains(t, err, "consumer.Config.MetricsAddr "+strconv.Quote(ln.Addr().String()))
	require.NotContains(t, err.Error(), "--")
}

// TestSubscriberErrorsNameTheirConfig: a setting of the subscriber's own
// Config that fails at start-up (an unreachable NATS URL) is reported naming
// that Config's field, not one of consumer.Config.
func TestSubscriberErrorsNameTheirConfig(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	c, err := consumer.New(consumer.Config{Pool: pool, Logger: testLogger(t),
		Inbox:     pgrelay.InboxConfig{Handler: &countingBatchHandler{}},
		Subscribe: broker.Subscribe(pgnats.NewSubscriber, pgnats.Config{URL: "nats://127.0.0.1:1"})})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = c.Run(ctx)
	require.ErrorContains(t, err, "nats.Config.URL nats://127.0.0.1:1")
	require.NotContains(t, err.Error(), "consumer.Config.URL")
}
