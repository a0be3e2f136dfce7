package pgrelay_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/broker"
	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/internal/testnats"
)

// TestConsumerConfigErrorsNameTheField: NewConsumer reports every bad
// setting under its ConsumerConfig name, never an internal one.
func TestConsumerConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	_, err := pgrelay.NewConsumer(pgrelay.ConsumerConfig{})
	require.ErrorContains(t, err, "ConsumerConfig.Pool is required")
	require.ErrorContains(t, err, "ConsumerConfig.NATSURL is required")
	require.ErrorContains(t, err, "ConsumerConfig.Handler is required")

	_, err = pgrelay.NewConsumer(pgrelay.ConsumerConfig{FetchBatchSize: -1, WorkerBatchSize: -3, Workers: -1,
		Lease: time.Second, MetricsAddr: "nonsense", DedupWindow: time.Minute, DedupRecordMax: -1})
	require.ErrorContains(t, err, "ConsumerConfig.FetchBatchSize -1 must be between 1 and 10000")
	require.ErrorContains(t, err, "ConsumerConfig.WorkerBatchSize must be between 1 and 10000, got -3")
	require.ErrorContains(t, err, "ConsumerConfig.Workers must be between 1 and 1000, got -1")
	require.ErrorContains(t, err, "ConsumerConfig.HandlerTimeout (10s) must be shorter than ConsumerConfig.Lease (1s)")
	require.ErrorContains(t, err, `ConsumerConfig.MetricsAddr "nonsense"`)
	require.ErrorContains(t, err, "ConsumerConfig.DedupWindow must be at least 1h0m0s, got 1m0s")
	require.ErrorContains(t, err, "ConsumerConfig.DedupRecordMax must be at least 1, got -1")
	require.NotContains(t, err.Error(), "Config.Inbox")
	require.NotContains(t, err.Error(), " Config.")

	cfg := pgrelay.ConsumerConfig{}.WithDefaults()
	require.Equal(t, pgrelay.DefaultStream, cfg.Stream)
	require.Equal(t, pgrelay.DefaultDurable, cfg.Durable)
	require.Equal(t, pgrelay.DefaultSubjectPrefix+".>", cfg.FilterSubject)
	require.Equal(t, pgrelay.DefaultWorkers, cfg.Workers)
	require.Equal(t, pgrelay.DefaultDedupWindow, cfg.DedupWindow)
	require.Empty(t, cfg.MetricsAddr, "no listener unless asked for")
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
	c, err := pgrelay.NewConsumer(pgrelay.ConsumerConfig{Pool: pool, NATSURL: natsURL, Stream: stream,
		SubjectPrefix: prefix, Handler: handler, MaxWait: 50 * time.Millisecond,
		Logger: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))})
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

// TestConsumerTakesASubscriber: with ConsumerConfig.Subscribe the consumer
// fetches from the subscriber it creates, whatever the broker, and needs no
// NATS settings of its own.
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
	subscribe := broker.SubscribeNATS(broker.NATSSubscriberConfig{URL: natsURL, Stream: stream, SubjectPrefix: prefix})
	c, err := pgrelay.NewConsumer(pgrelay.ConsumerConfig{Pool: pool, Handler: &countingBatchHandler{},
		MaxWait: 50 * time.Millisecond, Logger: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)),
		Subscribe: func(ctx context.Context) (pgrelay.Subscriber, error) {
			subscribed.Add(1)
			return subscribe(ctx)
		}})
	require.NoError(t, err, "no NATSURL is needed with Subscribe")
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
