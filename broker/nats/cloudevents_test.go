package nats_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	cejs "github.com/cloudevents/sdk-go/protocol/nats_jetstream/v2"
	cloudevents "github.com/cloudevents/sdk-go/v2"
	ceevent "github.com/cloudevents/sdk-go/v2/event"
	"github.com/jackc/pgx/v5"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/brokertest"
	"github.com/pgrelay/pgrelay/broker/nats"
	"github.com/pgrelay/pgrelay/consumer"
	"github.com/pgrelay/pgrelay/internal/cetest"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/internal/testnats"
	"github.com/pgrelay/pgrelay/relay"
)

// receiveSDK runs a CloudEvents SDK client over protocol p until the test
// ends and returns the channel of the events it receives.
func receiveSDK(t *testing.T, p interface{}) <-chan ceevent.Event {
	t.Helper()
	c, err := cloudevents.NewClient(p)
	require.NoError(t, err)
	got := make(chan ceevent.Event, 16)
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		_ = c.StartReceiver(ctx, func(e ceevent.Event) { got <- e })
	})
	t.Cleanup(func() { stop(); wg.Wait() })
	return got
}

func nextEvent(t *testing.T, got <-chan ceevent.Event) ceevent.Event {
	t.Helper()
	select {
	case e := <-got:
		return e
	case <-time.After(20 * time.Second):
		t.Fatal("the CloudEvents SDK received nothing")
		return ceevent.Event{}
	}
}

// TestCloudEventsNATSReadBySDK: a publisher in CloudEvents mode sends
// binary-mode messages that the CloudEvents Go SDK's JetStream binding reads
// as valid events: id, type, source, time, subject, datacontenttype,
// partitionkey and data as pgrelay has them; pgrelay's key sequence and
// dedup id travel beside them. An event without a type cannot be a
// CloudEvent: it fails permanently (the relay dead-letters it).
func TestCloudEventsNATSReadBySDK(t *testing.T) {
	t.Parallel()
	url := testnats.URL(t)
	stream, prefix := testnats.Stream(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := nats.NewPublisher(ctx, nats.Config{URL: url, Stream: stream, SubjectPrefix: prefix,
		WireFormat: broker.WireCloudEvents, CloudEventsSource: "/billing"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })

	at := time.Date(2026, 11, 25, 10, 0, 0, 123456000, time.UTC)
	res := p.Publish(ctx, []pgrelay.Message{
		{EventID: "e-1", Topic: "orders", Key: "order-7", KeySeq: 4, EventType: "OrderPaid", ContentType: "application/json",
			Payload: []byte(`{"order_id":"order-7"}`), Headers: map[string]string{"tenant": "acme"}, OccurredAt: at},
		{EventID: "e-2", Topic: "orders", EventType: "Blob", ContentType: "application/octet-stream",
			Payload: []byte{0, 1, 2}, OccurredAt: at},
		{EventID: "e-3", Topic: "orders", Key: "k", Payload: []byte("{}")},
	})
	require.NoError(t, res[0].Err)
	require.NoError(t, res[1].Err)
	require.True(t, broker.IsTerminal(res[2].Err), "%v", res[2].Err)
	require.ErrorContains(t, res[2].Err, "no event type")

	sdk, err := cejs.NewConsumer(url, stream, prefix+".orders", nil, nil, nil)
	require.NoError(t, err)
	got := receiveSDK(t, sdk)
	events := map[string]ceevent.Event{}
	for range 2 {
		e := nextEvent(t, got)
		require.NoError(t, e.Validate())
		events[e.ID()] = e
	}
	e1 := events["e-1"]
	require.Equal(t, "1.0", e1.SpecVersion())
	require.Equal(t, "OrderPaid", e1.Type())
	require.Equal(t, "/billing", e1.Source())
	require.True(t, at.Equal(e1.Time()), "time %s", e1.Time())
	require.Equal(t, "order-7", e1.Subject())
	require.Equal(t, "application/json", e1.DataContentType())
	require.Equal(t, "order-7", e1.Extensions()["partitionkey"])
	require.JSONEq(t, `{"order_id":"order-7"}`, string(e1.Data()))
	e2 := events["e-2"]
	require.Equal(t, "Blob", e2.Type())
	require.Equal(t, "", e2.Subject(), "no key, no subject")
	require.NotContains(t, e2.Extensions(), "partitionkey")
	require.Equal(t, "application/octet-stream", e2.DataContentType())
	require.Equal(t, []byte{0, 1, 2}, e2.Data())

	// pgrelay's own headers still travel, beside the attributes.
	_, js := testnats.Connect(t, url)
	s, err := js.Stream(ctx, stream)
	require.NoError(t, err)
	// Events of different keys may be stored in either order: look for e-1
	// by its dedup id among the three.
	var raw *jetstream.RawStreamMsg
	for seq := uint64(1); seq <= 3 && raw == nil; seq++ {
		m, err := s.GetMsg(ctx, seq)
		require.NoError(t, err)
		if m.Header.Get(nats.MsgIDHeader) == "e-1" {
			raw = m
		}
	}
	require.NotNil(t, raw, "no stored message has e-1 as its dedup id (JetStream's dedup id is the event id)")
	require.Equal(t, "4", raw.Header.Get(event.HeaderKeySeq))
	require.Equal(t, "orders", raw.Header.Get(event.HeaderTopic))
	require.Equal(t, "acme", raw.Header.Get(event.HeaderPrefix+"tenant"))
	require.Empty(t, raw.Header.Get(event.HeaderEventID), "the id is the ce-id attribute only")
}

// TestCloudEventsNATSSDKEventApplied: events the CloudEvents Go SDK sends
// through its JetStream binding are stored in the inbox under their id and
// applied once, a resent one included (a duplicate); in the same batch, a
// binary-mode message without an id and one of another specversion are
// stored dead with their reasons, and lose nothing else.
func TestCloudEventsNATSSDKEventApplied(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	url := testnats.URL(t)
	stream, prefix := testnats.Stream(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	sender, err := cejs.NewSender(url, stream, prefix+".orders", nil, nil)
	require.NoError(t, err)
	c, err := cloudevents.NewClient(sender)
	require.NoError(t, err)
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	e1 := cloudevents.NewEvent()
	e1.SetID("sdk-1")
	e1.SetSource("urn:test:sdk")
	e1.SetType("OrderCreated")
	e1.SetSubject("orders/1")
	e1.SetTime(at)
	e1.SetExtension("partitionkey", "order-1")
	e1.SetExtension("tenant", "acme")
	require.NoError(t, e1.SetData(cloudevents.ApplicationJSON, map[string]any{"order_id": "order-1"}))
	e2 := cloudevents.NewEvent()
	e2.SetID("sdk-2")
	e2.SetSource("urn:test:sdk")
	e2.SetType("Note")
	require.NoError(t, e2.SetData("text/plain", "hi"))

	send := func(e ceevent.Event) {
		require.True(t, cloudevents.IsACK(c.Send(ctx, e)))
	}
	_, js := testnats.Connect(t, url)
	raw := func(h natsgo.Header) {
		_, err := js.PublishMsg(ctx, &natsgo.Msg{Subject: prefix + ".orders", Header: h, Data: []byte("{}")})
		require.NoError(t, err)
	}
	send(e1)
	raw(natsgo.Header{"ce-specversion": {"1.0"}, "ce-source": {"/x"}, "ce-type": {"OrderCreated"}})
	send(e1) // resent: a duplicate
	raw(natsgo.Header{"ce-specversion": {"0.3"}, "ce-id": {"bad-spec"}, "ce-source": {"/x"}, "ce-type": {"OrderCreated"}})
	send(e2)

	cetest.Consume(t, pool, broker.Subscribe(nats.NewSubscriber, nats.Config{URL: url, Stream: stream, SubjectPrefix: prefix,
		Durable: "ce", DedupWindow: 48 * time.Hour}))
	rows := cetest.WaitInbox(t, pool, 4)

	r1 := rows["sdk-1"]
	require.Equal(t, "processed", r1.Status, r1.LastError)
	require.Equal(t, "OrderCreated", r1.EventType)
	require.Equal(t, "order-1", r1.Key, "the partitionkey is the key")
	require.Equal(t, "orders", r1.Topic)
	require.True(t, at.Equal(r1.OccurredAt))
	require.JSONEq(t, `{"order_id":"order-1"}`, string(r1.Payload))
	require.Equal(t, "urn:test:sdk", r1.Headers["ce-source"])
	require.Equal(t, "orders/1", r1.Headers["ce-subject"])
	require.Equal(t, "acme", r1.Headers["ce-tenant"])
	require.Equal(t, "application/json", r1.Headers[event.HeaderContentType])
	r2 := rows["sdk-2"]
	require.Equal(t, "processed", r2.Status, r2.LastError)
	require.Equal(t, "hi", string(r2.Payload))

	require.Equal(t, "dead", rows["bad-spec"].Status)
	require.Contains(t, rows["bad-spec"].LastError, `invalid CloudEvent: ce-specversion "0.3", want "1.0"`)
	var missing int
	for id, r := range rows {
		if id != "sdk-1" && id != "sdk-2" && id != "bad-spec" {
			missing++
			require.Equal(t, "dead", r.Status)
			require.Contains(t, r.LastError, "missing event id: no ce-id attribute")
		}
	}
	require.Equal(t, 1, missing)
	require.Equal(t, map[string]int{"sdk-1": 1, "sdk-2": 1}, cetest.Applied(t, pool), "each valid event applied once, the dead ones never")
}

// TestCloudEventsNATSRelayOrderedApply: outbox → relay publishing
// CloudEvents → JetStream → an ordered consumer. Every event is stored under
// its event id with its key sequence (carried beside the attributes as
// Pgrelay-Key-Seq) and each key's events are applied once, in sequence: per-key
// order and dedup work in CloudEvents mode as in pgrelay's own.
func TestCloudEventsNATSRelayOrderedApply(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	url := testnats.URL(t)
	stream, prefix := testnats.Stream(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pub, err := nats.NewPublisher(ctx, nats.Config{URL: url, Stream: stream, SubjectPrefix: prefix,
		WireFormat: broker.WireCloudEvents, CloudEventsSource: "/orders-service"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	r, err := relay.New(relay.Config{Pool: pool, Publisher: pub, PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	wg.Go(func() { _ = r.Run(runCtx) })

	ob, err := pgrelay.NewOutbox(pgrelay.OutboxConfig{})
	require.NoError(t, err)
	const keys, perKey = 3, 10
	for i := range perKey {
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for k := range keys {
				if err := ob.Enqueue(ctx, tx, pgrelay.Message{EventID: fmt.Sprintf("k%d-%d", k, i), Topic: "orders",
					Key: fmt.Sprintf("k%d", k), EventType: "Step", Payload: []byte("{}")}); err != nil {
					return err
				}
			}
			return nil
		}))
	}
	cetest.Consume(t, pool, broker.Subscribe(nats.NewSubscriber, nats.Config{URL: url, Stream: stream, SubjectPrefix: prefix,
		Durable: "ordered", DedupWindow: 48 * time.Hour}), func(c *consumer.Config) { c.Inbox.Ordered = true })
	rows := cetest.WaitInbox(t, pool, keys*perKey)
	for id, row := range rows {
		require.Equal(t, "processed", row.Status, "%s: %s", id, row.LastError)
		require.NotContains(t, row.Headers, "ce-source", "a relay's source is its setting, not the event's")
		var k, i int
		_, err := fmt.Sscanf(id, "k%d-%d", &k, &i)
		require.NoError(t, err)
		require.Equal(t, int64(i+1), row.KeySeq, "%s: the key sequence travelled", id)
	}
	want := make([]int64, perKey)
	for i := range want {
		want[i] = int64(i + 1)
	}
	for k, seqs := range cetest.AppliedSeqs(t, pool) {
		require.Equal(t, want, seqs, "key %s applied once each, in sequence", k)
	}
}

// TestCloudEventsNATSConformance runs the broker conformance suite with the
// publisher in CloudEvents mode (the fault cases, which do not depend on the
// wire format, run in TestNATSConformance): ordering, acknowledgements,
// duplicates, permanent failures and decoding hold the same.
func TestCloudEventsNATSConformance(t *testing.T) {
	t.Parallel()
	url := testnats.URL(t)
	h := natsHarness(t, url)
	ce := func(t *testing.T, ns string) broker.Publisher {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		p, err := nats.NewPublisher(ctx, nats.Config{URL: url, Stream: ns, SubjectPrefix: ns, AckTimeout: 2 * time.Second,
			ReconnectWait: 100 * time.Millisecond, WireFormat: broker.WireCloudEvents})
		require.NoError(t, err)
		return p
	}
	newPublisher := h.NewPublisher
	h.NewPublisher = func(t *testing.T, ns string) broker.Publisher {
		require.NoError(t, newPublisher(t, ns).Close()) // creates the namespace's stream
		return ce(t, ns)
	}
	h.UnknownDestination = ce
	h.Proxied, h.Restartable = nil, nil
	brokertest.Run(t, h)
}

// FuzzCloudEventsNATSRoundTrip: the relay's NATS message in CloudEvents
// mode, decoded as the NATS subscriber does, is the event it was made from,
// as in pgrelay's format.
func FuzzCloudEventsNATSRoundTrip(f *testing.F) {
	p := nats.CloudEventsPublisherForTest("pgrelay")
	brokertest.FuzzRoundTrip(f, func(t *testing.T, m pgrelay.Message) broker.Delivery {
		return nats.RoundTripWireForTest(t, p, m)
	})
}
