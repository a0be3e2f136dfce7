package consumer_test

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/nats"
	"github.com/pgrelay/pgrelay/consumer"
	"github.com/pgrelay/pgrelay/internal/logtest"
	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/internal/testnats"
	"github.com/pgrelay/pgrelay/relay"
)

// TestBinaryPayloadEndToEnd enqueues protobuf-like bytes (NUL, 0xff, invalid
// UTF-8) and has them travel outbox → relay → JetStream → consumer → inbox →
// handler, which must get the exact bytes and the content type. A binary
// payload without a content type passes too; a payload declared JSON must be
// UTF-8, which Enqueue checks.
func TestBinaryPayloadEndToEnd(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	natsURL := testnats.URL(t)
	stream, prefix := testnats.Stream(t, natsURL)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// A protobuf encoding of {1: 150, 2: "\xff\x00"}, with bytes that are not
	// UTF-8 and a NUL.
	proto := []byte{0x08, 0x96, 0x01, 0x12, 0x02, 0xff, 0x00, 0xc3, 0x28}
	raw := []byte{0x00, 0xfe, 0xff, 0x80}
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, pgrelay.Enqueue(ctx, tx,
		pgrelay.Message{EventID: "proto-1", Topic: "orders", EventType: "OrderCreated", Payload: proto,
			ContentType: "application/x-protobuf", Headers: map[string]string{"schema": "v1"}},
		pgrelay.Message{EventID: "raw-1", Topic: "orders", EventType: "Blob", Payload: raw}))
	require.NoError(t, tx.Commit(ctx))
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return pgrelay.Enqueue(ctx, tx, pgrelay.Message{Topic: "orders", EventType: "X", Payload: raw,
			ContentType: "application/json; charset=utf-8"})
	})
	require.ErrorIs(t, err, pgrelay.ErrPayloadNotText)

	pub, err := nats.NewPublisher(ctx, nats.Config{URL: natsURL, SubjectPrefix: prefix, Stream: stream})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	r, err := relay.New(relay.Config{Pool: pool, Publisher: pub, PollInterval: 20 * time.Millisecond,
		Logger: logtest.NewAt(t, slog.LevelWarn)})
	require.NoError(t, err)

	var mu sync.Mutex
	got := map[string]pgrelay.InboxEvent{}
	c, err := consumer.New(consumer.Config{
		Pool: pool, MaxWait: 50 * time.Millisecond, Logger: testLogger(t),
		Subscribe: broker.Subscribe(nats.NewSubscriber, nats.Config{URL: natsURL, Stream: stream, SubjectPrefix: prefix}),
		Inbox: pgrelay.InboxConfig{Handler: pgrelay.HandlerFunc(func(_ context.Context, _ pgx.Tx, ev *pgrelay.InboxEvent) error {
			mu.Lock()
			defer mu.Unlock()
			got[ev.EventID] = *ev
			return nil
		})},
	})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = r.Run(runCtx) })
	wg.Go(func() { require.NoError(t, c.Run(runCtx)) })
	defer func() { stop(); wg.Wait() }()

	require.Eventually(t, func() bool {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM pgrelay.inbox WHERE status = 'processed'`).Scan(&n)
		return n == 2
	}, 30*time.Second, 20*time.Millisecond, "both binary events processed, none dead at ingest")

	mu.Lock()
	defer mu.Unlock()
	require.True(t, bytes.Equal(proto, got["proto-1"].Payload), "exact bytes: %x", got["proto-1"].Payload)
	require.Equal(t, "application/x-protobuf", got["proto-1"].ContentType)
	require.Equal(t, map[string]string{"schema": "v1"}, got["proto-1"].Headers, "the content type is not a header of the handler's")
	require.True(t, bytes.Equal(raw, got["raw-1"].Payload), "exact bytes: %x", got["raw-1"].Payload)
	require.Empty(t, got["raw-1"].ContentType)
}
