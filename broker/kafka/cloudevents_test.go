package kafka_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	kafkasarama "github.com/cloudevents/sdk-go/protocol/kafka_sarama/v2"
	cloudevents "github.com/cloudevents/sdk-go/v2"
	ceevent "github.com/cloudevents/sdk-go/v2/event"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/brokertest"
	"github.com/pgrelay/pgrelay/broker/kafka"
	"github.com/pgrelay/pgrelay/internal/cetest"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// saramaConfig is the Sarama client configuration of the CloudEvents SDK's
// Kafka binding in these tests: a protocol version with record headers,
// reading a new group's partitions from the start. Version 2.1: with 2.8 or
// 3.6, Sarama's consumer group fails against kfake ("error decoding packet:
// invalid byteslice length") before it consumes anything.
func saramaConfig() *sarama.Config {
	c := sarama.NewConfig()
	c.Version = sarama.V2_1_0_0
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	c.Consumer.Group.Session.Timeout = 6 * time.Second
	c.Consumer.Group.Heartbeat.Interval = time.Second
	return c
}

// TestCloudEventsKafkaReadBySDK: a publisher in CloudEvents mode writes
// binary-mode records that the CloudEvents Go SDK's Kafka binding (Sarama,
// consumer group, against kfake) reads as valid events: id, type, source,
// time, subject, datacontenttype (the content-type header), partitionkey
// (also the record key) and data as pgrelay has them; pgrelay's key
// sequence travels beside them.
func TestCloudEventsKafkaReadBySDK(t *testing.T) {
	t.Parallel()
	brokers := kafkaBrokers(t)
	ns := brokertest.Namespace("ce")
	createTopic(t, brokers, ns+".orders", 2)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pub, err := kafka.NewPublisher(ctx, kafka.Config{Brokers: brokers, TopicPrefix: ns,
		WireFormat: broker.WireCloudEvents, CloudEventsSource: "urn:example:billing"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })

	at := time.Date(2026, 11, 25, 10, 0, 0, 123456000, time.UTC)
	res := pub.Publish(ctx, []pgrelay.Message{
		{EventID: "e-1", Topic: "orders", Key: "order-7", KeySeq: 4, EventType: "OrderPaid", ContentType: "application/json",
			Payload: []byte(`{"order_id":"order-7"}`), Headers: map[string]string{"tenant": "acme"}, OccurredAt: at},
		{EventID: "e-2", Topic: "orders", EventType: "Blob", ContentType: "application/octet-stream",
			Payload: []byte{0, 1, 2}, OccurredAt: at},
		{EventID: "e-3", Topic: "orders", Key: "k", Payload: []byte("{}")},
	})
	require.NoError(t, res[0].Err)
	require.NoError(t, res[1].Err)
	require.True(t, broker.IsTerminal(res[2].Err), "%v", res[2].Err)

	sdk, err := kafkasarama.NewConsumer(brokers, saramaConfig(), ns+"-sdk", ns+".orders")
	require.NoError(t, err)
	c, err := cloudevents.NewClient(sdk)
	require.NoError(t, err)
	got := make(chan ceevent.Event, 16)
	rctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := c.StartReceiver(rctx, func(e ceevent.Event) { got <- e }); err != nil {
			t.Logf("receiver: %v", err)
		}
	})
	t.Cleanup(func() { stop(); wg.Wait() })

	events := map[string]ceevent.Event{}
	for range 2 {
		select {
		case e := <-got:
			require.NoError(t, e.Validate())
			events[e.ID()] = e
		case <-time.After(45 * time.Second):
			t.Fatalf("the CloudEvents SDK received %d events", len(events))
		}
	}
	e1 := events["e-1"]
	require.Equal(t, "1.0", e1.SpecVersion())
	require.Equal(t, "OrderPaid", e1.Type())
	require.Equal(t, "urn:example:billing", e1.Source())
	require.True(t, at.Equal(e1.Time()), "time %s", e1.Time())
	require.Equal(t, "order-7", e1.Subject())
	require.Equal(t, "application/json", e1.DataContentType())
	require.Equal(t, "order-7", e1.Extensions()["partitionkey"])
	require.JSONEq(t, `{"order_id":"order-7"}`, string(e1.Data()))
	e2 := events["e-2"]
	require.Equal(t, "Blob", e2.Type())
	require.Equal(t, "", e2.Subject())
	require.NotContains(t, e2.Extensions(), "partitionkey")
	require.Equal(t, "application/octet-stream", e2.DataContentType())
	require.Equal(t, []byte{0, 1, 2}, e2.Data())

	// The record itself: key = partitionkey, pgrelay's headers beside.
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(ns+".orders"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	defer cl.Close()
	var rec *kgo.Record
	for rec == nil {
		fs := cl.PollFetches(ctx)
		require.NoError(t, ctx.Err())
		fs.EachRecord(func(r *kgo.Record) {
			if string(r.Key) == "order-7" {
				rec = r
			}
		})
	}
	h := map[string]string{}
	for _, rh := range rec.Headers {
		h[rh.Key] = string(rh.Value)
	}
	require.Equal(t, "4", h[event.HeaderKeySeq])
	require.Equal(t, "order-7", h["ce_partitionkey"])
	require.Equal(t, "application/json", h["content-type"])
	require.NotContains(t, h, event.HeaderEventID)
}

// TestCloudEventsKafkaSDKEventApplied: events the CloudEvents Go SDK sends
// through its Kafka binding (Sarama producer, against kfake) are stored in
// the inbox under their id and applied once, a resent one included; in the
// same batch, a binary-mode record without an id and one of another
// specversion are stored dead with their reasons, and lose nothing else.
func TestCloudEventsKafkaSDKEventApplied(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	brokers := kafkaBrokers(t)
	ns := brokertest.Namespace("cesdk")
	topic := ns + ".orders"
	createTopic(t, brokers, topic, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	sender, err := kafkasarama.NewSender(brokers, saramaConfig(), topic)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sender.Close(context.Background()) })
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
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	require.NoError(t, err)
	defer cl.Close()
	raw := func(h map[string]string) {
		r := &kgo.Record{Topic: topic, Value: []byte("{}")}
		for k, v := range h {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
		}
		require.NoError(t, cl.ProduceSync(ctx, r).FirstErr())
	}
	send(e1)
	raw(map[string]string{"ce_specversion": "1.0", "ce_source": "/x", "ce_type": "OrderCreated"})
	send(e1) // resent: a duplicate
	raw(map[string]string{"ce_specversion": "0.3", "ce_id": "bad-spec", "ce_source": "/x", "ce_type": "OrderCreated"})
	send(e2)

	cetest.Consume(t, pool, broker.Subscribe(kafka.NewSubscriber, kafka.Config{Brokers: brokers, TopicPrefix: ns, Group: ns,
		SessionTimeout: 6 * time.Second, CommitInterval: 50 * time.Millisecond, MetadataMaxAge: time.Second}))
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
	require.Contains(t, rows["bad-spec"].LastError, `invalid CloudEvent: ce_specversion "0.3", want "1.0"`)
	r := rows[kafka.FallbackEventID(topic, 0, 1)]
	require.Equal(t, "dead", r.Status, "the record without an id is stored under its position")
	require.Contains(t, r.LastError, "missing event id: no ce_id attribute")
	require.Equal(t, map[string]int{"sdk-1": 1, "sdk-2": 1}, cetest.Applied(t, pool), "each valid event applied once, the dead ones never")
}
