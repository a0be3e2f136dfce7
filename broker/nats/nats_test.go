package nats_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/nats"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/testnats"
)

func newNATS(t testing.TB) (*nats.Publisher, jetstream.Stream) {
	t.Helper()
	url := testnats.URL(t)
	stream, prefix := testnats.Stream(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := nats.NewPublisher(ctx, nats.Config{URL: url, Stream: stream, SubjectPrefix: prefix, AckTimeout: 2 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	_, js := testnats.Connect(t, url)
	s, err := js.Stream(ctx, stream)
	require.NoError(t, err)
	return p, s
}

func TestNATSPublishAcksAndDuplicates(t *testing.T) {
	t.Parallel()
	p, s := newNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	msgs := make([]pgrelay.Message, 50)
	for i := range msgs {
		msgs[i] = pgrelay.Message{EventID: fmt.Sprintf("e-%d", i), Topic: "orders", Key: "k", EventType: "OrderPaid",
			Payload: []byte{byte(i)}, Headers: map[string]string{"trace-id": "t"}, OccurredAt: time.Unix(1, 5).UTC()}
	}
	for _, r := range p.Publish(ctx, msgs) {
		require.NoError(t, r.Err)
		require.False(t, r.Duplicate)
	}
	for _, r := range p.Publish(ctx, msgs[:10]) {
		require.NoError(t, r.Err)
		require.True(t, r.Duplicate, "a republished event id is a duplicate")
	}
	info, err := s.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(50), info.State.Msgs)

	m, err := s.GetMsg(ctx, 1)
	require.NoError(t, err)
	require.Equal(t, p.Subject("orders"), m.Subject)
	require.Equal(t, "e-0", m.Header.Get(nats.MsgIDHeader))
	require.Equal(t, "e-0", m.Header.Get(event.HeaderEventID))
	require.Equal(t, "OrderPaid", m.Header.Get(event.HeaderEventType))
	require.Equal(t, "orders", m.Header.Get(event.HeaderTopic))
	require.Equal(t, "k", m.Header.Get(event.HeaderKey))
	require.Equal(t, "1970-01-01T00:00:01.000000005Z", m.Header.Get(event.HeaderOccurredAt))
	require.Equal(t, "t", m.Header.Get(event.HeaderPrefix+"trace-id"))
	require.Equal(t, []byte{0}, m.Data)
}

func TestNATSPermanentAndTransientErrors(t *testing.T) {
	t.Parallel()
	p, _ := newNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res := p.Publish(ctx, []pgrelay.Message{
		{EventID: "big", Topic: "orders", Payload: make([]byte, 2<<20)},
		{EventID: "bad", Topic: "orders x"},
		{EventID: "ok", Topic: "orders"},
	})
	require.True(t, broker.IsTerminal(res[0].Err), "%v", res[0].Err)
	require.ErrorContains(t, res[0].Err, "too large")
	require.True(t, broker.IsTerminal(res[1].Err), "%v", res[1].Err)
	require.NoError(t, res[2].Err, "one bad message does not spoil the batch")

	done, cancelDone := context.WithCancel(context.Background())
	cancelDone()
	res = p.Publish(done, []pgrelay.Message{{EventID: "late", Topic: "orders"}})
	if res[0].Err != nil {
		require.False(t, broker.IsTerminal(res[0].Err), "a cancelled wait is transient: %v", res[0].Err)
	}
}

// TestNATSKeyNotSentAfterTransientFailure: a key's message that fails
// transiently (its subject is full, with DiscardNew) stops the key: its later
// message in the batch, to a subject with room, is not sent, so it cannot be
// stored ahead of the failed one. Other keys go on.
func TestNATSKeyNotSentAfterTransientFailure(t *testing.T) {
	t.Parallel()
	url := testnats.URL(t)
	_, js := testnats.Connect(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	name := fmt.Sprintf("FULL%d", time.Now().UnixNano())
	prefix := "full" + name[4:]
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: name, Subjects: []string{prefix + ".>"}, Storage: jetstream.MemoryStorage,
		MaxMsgsPerSubject: 1, Discard: jetstream.DiscardNew, DiscardNewPerSubject: true,
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	p, err := nats.NewPublisher(ctx, nats.Config{URL: url, Stream: name, SubjectPrefix: prefix, AckTimeout: 2 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })

	require.NoError(t, p.Publish(ctx, []pgrelay.Message{{EventID: "filler", Topic: "full", Key: "x"}})[0].Err)
	res := p.Publish(ctx, []pgrelay.Message{
		{EventID: "k-1", Topic: "full", Key: "k"},
		{EventID: "k-2", Topic: "roomy", Key: "k"},
		{EventID: "j-1", Topic: "other", Key: "j"},
	})
	require.Error(t, res[0].Err)
	require.False(t, broker.IsTerminal(res[0].Err), "a full subject is transient: %v", res[0].Err)
	require.ErrorContains(t, res[1].Err, "not sent")
	require.NoError(t, res[2].Err, "another key goes on")
	info, err := s.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(2), info.State.Msgs, "filler and j-1 only: k-2 was not stored ahead of k-1")
}

// TestNATSTooLargeNamesTheLimit: a message over the server's max_payload or
// over the stream's max_msg_size goes dead with a reason naming the limit's
// value and the message's size, so the operator knows what to raise.
func TestNATSTooLargeNamesTheLimit(t *testing.T) {
	t.Parallel()
	url := testnats.URL(t)
	nc, js := testnats.Connect(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	name := fmt.Sprintf("SMALL%d", time.Now().UnixNano())
	prefix := "small" + name[5:]
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: name, Subjects: []string{prefix + ".>"}, Storage: jetstream.MemoryStorage, MaxMsgSize: 1000,
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	p, err := nats.NewPublisher(ctx, nats.Config{URL: url, Stream: name, SubjectPrefix: prefix, AckTimeout: 2 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })

	server := nc.MaxPayload()
	res := p.Publish(ctx, []pgrelay.Message{
		{EventID: "over-stream", Topic: "orders", Key: "a", Payload: make([]byte, 2000)},
		{EventID: "over-server", Topic: "orders", Key: "b", Payload: make([]byte, server+1)},
	})
	require.True(t, broker.IsTerminal(res[0].Err), "%v", res[0].Err)
	require.ErrorContains(t, res[0].Err, "the stream's max_msg_size is 1000 bytes")
	require.ErrorContains(t, res[0].Err, "payload of 2000 bytes")
	require.True(t, broker.IsTerminal(res[1].Err), "%v", res[1].Err)
	require.ErrorContains(t, res[1].Err, fmt.Sprintf("the server's max_payload is %d bytes", server))
	require.ErrorContains(t, res[1].Err, fmt.Sprintf("payload of %d bytes", server+1))
}
