package admin_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/broker/nats"
	"github.com/pgrelay/pgrelay/internal/admin"
	"github.com/pgrelay/pgrelay/internal/admin/admintest"
	"github.com/pgrelay/pgrelay/internal/logtest"
	"github.com/pgrelay/pgrelay/internal/testnats"
	"github.com/pgrelay/pgrelay/relay"
)

// TestRequeuedOutboxRowIsPublishedOnce: a dead outbox row requeued by an
// operator is published by the real relay, once, with its event id as the
// broker's dedup id.
func TestRequeuedOutboxRowIsPublishedOnce(t *testing.T) {
	t.Parallel()
	b := admintest.Setup(t)
	ctx := context.Background()
	// The row went dead before this relay started (a broker rejection).
	admintest.OutboxRow(t, b.Pool, "o-dead", "orders", "OrderPaid", true, time.Hour, "nats: maximum payload exceeded")

	natsURL := testnats.URL(t)
	stream, prefix := testnats.Stream(t, natsURL)
	_, js := testnats.Connect(t, natsURL)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	pub, err := nats.NewPublisher(cctx, nats.Config{URL: natsURL, SubjectPrefix: prefix, Stream: stream})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	r, err := relay.New(relay.Config{Pool: b.Pool, Publisher: pub, PollInterval: 20 * time.Millisecond,
		Logger: logtest.NewAt(t, slog.LevelWarn), Lease: 3 * time.Second})
	require.NoError(t, err)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	t.Cleanup(func() { stop(); <-done })

	// A live row proves the relay runs; the dead one stays unpublished.
	admintest.OutboxRow(t, b.Pool, "o-live", "orders", "OrderPaid", false, 0, "")
	require.Eventually(t, func() bool { return admintest.OutboxStatus(t, b.Pool, "o-live") == "published" }, 20*time.Second, 10*time.Millisecond)
	require.Equal(t, "dead", admintest.OutboxStatus(t, b.Pool, "o-dead"))

	res, err := b.Svc.Requeue(ctx, admin.SourceOutbox, admin.RequeueRequest{Filter: admin.Filter{EventID: "o-dead"}, Actor: "ops", Reason: "limit raised"})
	require.NoError(t, err)
	require.Equal(t, 1, res.Count)
	require.Eventually(t, func() bool { return admintest.OutboxStatus(t, b.Pool, "o-dead") == "published" }, 20*time.Second, 10*time.Millisecond)

	s, err := js.Stream(cctx, stream)
	require.NoError(t, err)
	info, err := s.Info(cctx)
	require.NoError(t, err)
	require.Equal(t, uint64(2), info.State.Msgs, "each event is in the stream once")
	msg, err := s.GetLastMsgForSubject(cctx, prefix+".orders")
	require.NoError(t, err)
	require.Equal(t, "o-dead", msg.Header.Get(nats.MsgIDHeader))
}
