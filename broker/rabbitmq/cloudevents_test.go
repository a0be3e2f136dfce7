package rabbitmq_test

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
	ceevent "github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/brokertest"
	"github.com/pgrelay/pgrelay/broker/rabbitmq"
	"github.com/pgrelay/pgrelay/internal/cetest"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/testamqp"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// The CloudEvents Go SDK's AMQP binding (protocol/amqp/v2) speaks AMQP 1.0
// (cloudevents_amqp10_test.go drives it through RabbitMQ's AMQP 1.0 plugin)
// and reads only the "cloudEvents:" prefix, not the "cloudEvents_" one the
// AMQP binding prefers and pgrelay writes by default. So these tests read and
// write AMQP 0-9-1 messages through the SDK's binding machinery as well: the
// SDK's spec package (attribute names and versions under the prefix),
// binding.ToEvent and binding.Write (the conversions and validation every
// SDK protocol binding uses), over the two small adapters below.

const ceAMQPPrefix = "cloudEvents_"

var ceAMQPSpecs = spec.WithPrefix(ceAMQPPrefix)

// amqpCEMessage is an AMQP 0-9-1 delivery as an SDK binding.Message in
// binary mode, read the way the SDK's AMQP binding reads an AMQP 1.0 one:
// datacontenttype from the content-type property, every other attribute
// from the prefixed headers (application properties).
type amqpCEMessage struct {
	d       amqp.Delivery
	version spec.Version
}

func newAMQPCEMessage(d amqp.Delivery) *amqpCEMessage {
	m := &amqpCEMessage{d: d}
	if sv, ok := d.Headers[ceAMQPSpecs.PrefixedSpecVersionName()].(string); ok {
		m.version = ceAMQPSpecs.Version(sv)
	}
	return m
}

func (m *amqpCEMessage) ReadEncoding() binding.Encoding {
	if m.version != nil {
		return binding.EncodingBinary
	}
	return binding.EncodingUnknown
}

func (m *amqpCEMessage) ReadStructured(context.Context, binding.StructuredWriter) error {
	return binding.ErrNotStructured
}

func (m *amqpCEMessage) ReadBinary(_ context.Context, w binding.BinaryWriter) error {
	if m.version == nil {
		return binding.ErrNotBinary
	}
	if m.d.ContentType != "" {
		if err := w.SetAttribute(m.version.AttributeFromKind(spec.DataContentType), m.d.ContentType); err != nil {
			return err
		}
	}
	for k, v := range m.d.Headers {
		if !strings.HasPrefix(k, ceAMQPPrefix) {
			continue
		}
		var err error
		if attr := m.version.Attribute(k); attr != nil {
			err = w.SetAttribute(attr, v)
		} else {
			err = w.SetExtension(strings.ToLower(strings.TrimPrefix(k, ceAMQPPrefix)), v)
		}
		if err != nil {
			return err
		}
	}
	if len(m.d.Body) > 0 {
		return w.SetData(bytes.NewReader(m.d.Body))
	}
	return nil
}

func (m *amqpCEMessage) Finish(error) error { return nil }

func (m *amqpCEMessage) GetAttribute(k spec.Kind) (spec.Attribute, any) {
	attr := m.version.AttributeFromKind(k)
	if attr == nil {
		return nil, nil
	}
	if k == spec.DataContentType {
		return attr, m.d.ContentType
	}
	return attr, m.d.Headers[attr.PrefixedName()]
}

func (m *amqpCEMessage) GetExtension(name string) any { return m.d.Headers[ceAMQPPrefix+name] }

var _ binding.MessageMetadataReader = (*amqpCEMessage)(nil)

// amqpCEWriter is an SDK binding.BinaryWriter filling an AMQP 0-9-1
// publishing: datacontenttype as the content-type property, every other
// attribute as a prefixed header.
type amqpCEWriter amqp.Publishing

func (w *amqpCEWriter) Start(context.Context) error {
	w.Headers = amqp.Table{}
	return nil
}

func (w *amqpCEWriter) SetAttribute(attr spec.Attribute, value any) error {
	s, err := types.Format(value)
	if err != nil {
		return err
	}
	if attr.Kind() == spec.DataContentType {
		w.ContentType = s
		return nil
	}
	w.Headers[ceAMQPPrefix+attr.Name()] = s
	return nil
}

func (w *amqpCEWriter) SetExtension(name string, value any) error {
	s, err := types.Format(value)
	if err != nil {
		return err
	}
	w.Headers[ceAMQPPrefix+name] = s
	return nil
}

func (w *amqpCEWriter) SetData(r io.Reader) error {
	b, err := io.ReadAll(r)
	w.Body = b
	return err
}

func (w *amqpCEWriter) End(context.Context) error { return nil }

// TestCloudEventsRabbitMQReadBySDK: a publisher in CloudEvents mode sends
// binary-mode messages ("cloudEvents_" headers, datacontenttype as the
// content-type property) that the CloudEvents Go SDK's binding turns into
// valid events: id, type, source, time, subject, datacontenttype,
// partitionkey and data as pgrelay has them; the message-id property (the
// event id) and pgrelay's key sequence travel beside them.
func TestCloudEventsRabbitMQReadBySDK(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.WireFormat, cfg.CloudEventsSource = broker.WireCloudEvents, "/billing"
	p := newPublisher(t, cfg)
	ctx := ctxT(t, 30*time.Second)
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

	events := map[string]*ceevent.Event{}
	deliveries := map[string]amqp.Delivery{}
	for range 2 { // different keys: in either order
		d := rawGet(t, cfg.URL, cfg.Queue)
		e, err := binding.ToEvent(ctx, newAMQPCEMessage(d))
		require.NoError(t, err)
		require.NoError(t, e.Validate())
		events[e.ID()], deliveries[e.ID()] = e, d
	}
	e1, d1 := events["e-1"], deliveries["e-1"]
	require.NotNil(t, e1)
	require.Equal(t, "1.0", e1.SpecVersion())
	require.Equal(t, "OrderPaid", e1.Type())
	require.Equal(t, "/billing", e1.Source())
	require.True(t, at.Equal(e1.Time()), "time %s", e1.Time())
	require.Equal(t, "order-7", e1.Subject())
	require.Equal(t, "application/json", e1.DataContentType())
	require.Equal(t, "order-7", e1.Extensions()["partitionkey"])
	require.JSONEq(t, `{"order_id":"order-7"}`, string(e1.Data()))
	require.Equal(t, "e-1", d1.MessageId)
	require.Equal(t, "4", d1.Headers[event.HeaderKeySeq])
	require.NotContains(t, d1.Headers, event.HeaderEventID)
	require.NotContains(t, d1.Headers, ceAMQPPrefix+"datacontenttype", "datacontenttype is the content-type property only")

	e2 := events["e-2"]
	require.NotNil(t, e2)
	require.Equal(t, "", e2.Subject())
	require.NotContains(t, e2.Extensions(), "partitionkey")
	require.Equal(t, "application/octet-stream", e2.DataContentType())
	require.Equal(t, []byte{0, 1, 2}, e2.Data())
}

// TestCloudEventsRabbitMQSDKEventApplied: events built by the CloudEvents
// Go SDK and written by its binding.Write into AMQP messages are stored in
// the inbox under their id and applied once, a resent one included; in the
// same batch, a binary-mode message without an id and one of another
// specversion are stored dead with their reasons, and lose nothing else.
func TestCloudEventsRabbitMQSDKEventApplied(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	cfg := testConfig(t)
	ctx := ctxT(t, 60*time.Second)
	// A subscriber declares the exchange and the queue; closed, so that the
	// consumer's own subscriber gets every message.
	decl, err := rabbitmq.NewSubscriber(ctx, cfg)
	require.NoError(t, err)
	_, err = decl.Fetch(ctx, 1, 10*time.Millisecond)
	require.NoError(t, err)
	require.NoError(t, decl.Close())

	conn, err := amqp.Dial(cfg.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	publish := func(p amqp.Publishing) {
		require.NoError(t, ch.PublishWithContext(ctx, cfg.Exchange, "orders", true, false, p))
	}
	send := func(e ceevent.Event) {
		require.NoError(t, e.Validate())
		var w amqpCEWriter
		_, err := binding.Write(ctx, binding.ToMessage(&e), nil, &w)
		require.NoError(t, err)
		publish(amqp.Publishing(w))
	}
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

	send(e1)
	publish(amqp.Publishing{Headers: amqp.Table{"cloudEvents_specversion": "1.0", "cloudEvents_source": "/x", "cloudEvents_type": "OrderCreated"},
		MessageId: "not-an-attribute", Body: []byte("{}")})
	send(e1) // resent: a duplicate
	publish(amqp.Publishing{Headers: amqp.Table{"cloudEvents:specversion": "0.3", "cloudEvents:id": "bad-spec", "cloudEvents:source": "/x",
		"cloudEvents:type": "OrderCreated"}, Body: []byte("{}")})
	send(e2)

	cetest.Consume(t, pool, broker.Subscribe(rabbitmq.NewSubscriber, cfg))
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
	require.Contains(t, rows["bad-spec"].LastError, `invalid CloudEvent: cloudEvents:specversion "0.3", want "1.0"`)
	var missing int
	for id, r := range rows {
		if id != "sdk-1" && id != "sdk-2" && id != "bad-spec" {
			missing++
			require.Equal(t, "dead", r.Status)
			require.Contains(t, r.LastError, "missing event id: no cloudEvents_id attribute")
			require.True(t, strings.HasPrefix(id, "amqp:"), "stored under its stand-in id, not the message-id: %s", id)
		}
	}
	require.Equal(t, 1, missing)
	require.Equal(t, map[string]int{"sdk-1": 1, "sdk-2": 1}, cetest.Applied(t, pool), "each valid event applied once, the dead ones never")
}

// TestCloudEventsRabbitMQConformance runs the broker conformance suite with
// the publisher in CloudEvents mode (the fault cases, which do not depend on
// the wire format, run in TestConformance).
func TestCloudEventsRabbitMQConformance(t *testing.T) {
	u := testamqp.URL(t)
	h := harness(u, u)
	h.NewPublisher = func(t *testing.T, ns string) broker.Publisher {
		cfg := config(u, ns, "c")
		cfg.MaxMessageBytes = suiteMaxMessageBytes
		cfg.WireFormat = broker.WireCloudEvents
		t.Cleanup(func() { testamqp.Delete(t, u, ns, ns+"_c") })
		p, err := rabbitmq.NewPublisher(ctxT(t, 30*time.Second), cfg)
		require.NoError(t, err)
		return p
	}
	h.UnknownDestination = nil // the exchange without a queue: the same in both formats (TestConformance)
	brokertest.Run(t, h)
}
