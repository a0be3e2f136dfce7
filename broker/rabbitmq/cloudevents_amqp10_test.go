package rabbitmq_test

import (
	"context"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	goamqp "github.com/Azure/go-amqp"
	ceamqp "github.com/cloudevents/sdk-go/protocol/amqp/v2"
	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	ceevent "github.com/cloudevents/sdk-go/v2/event"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/rabbitmq"
	"github.com/pgrelay/pgrelay/internal/cetest"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// These tests use the CloudEvents Go SDK's real AMQP binding
// (protocol/amqp/v2 over Azure's go-amqp), which speaks AMQP 1.0: RabbitMQ
// 3.x serves it on the AMQP port with the rabbitmq_amqp1_0 plugin enabled
// (.ci/run enables it). Its addresses: "/amq/queue/<q>" consumes a queue,
// "/exchange/<x>/<rk>" publishes to an exchange with a routing key.

// amqp10Options are the SDK options that reach the server of the AMQP
// 0-9-1 URL u over AMQP 1.0: its user and password (SASL PLAIN), its
// virtual host ("vhost:<name>" as the plugin's hostname), and the server
// address.
func amqp10Options(t *testing.T, u string) (string, []ceamqp.Option) {
	t.Helper()
	server, connOpts := amqp10ConnOptions(t, u)
	opts := make([]ceamqp.Option, 0, len(connOpts))
	for _, o := range connOpts {
		opts = append(opts, ceamqp.WithConnOpt(o))
	}
	return server, opts
}

func amqp10ConnOptions(t *testing.T, u string) (string, []goamqp.ConnOption) {
	t.Helper()
	pu, err := url.Parse(u)
	require.NoError(t, err)
	user, pass := "guest", "guest"
	if pu.User != nil {
		user = pu.User.Username()
		if p, ok := pu.User.Password(); ok {
			pass = p
		}
	}
	opts := []goamqp.ConnOption{goamqp.ConnSASLPlain(user, pass), goamqp.ConnConnectTimeout(10 * time.Second)}
	if vhost, _ := url.PathUnescape(strings.TrimPrefix(pu.Path, "/")); vhost != "" {
		opts = append(opts, goamqp.ConnServerHostname("vhost:"+vhost))
	}
	return "amqp://" + pu.Host, opts
}

// requireAMQP10 skips the test when the RabbitMQ server at u does not speak
// AMQP 1.0 (the rabbitmq_amqp1_0 plugin is off: it answers with its AMQP
// 0-9-1 header), or fails it when CI is set, as a missing service does
// (testamqp).
func requireAMQP10(t *testing.T, u string) {
	t.Helper()
	server, opts := amqp10ConnOptions(t, u)
	c, err := goamqp.Dial(server, opts...)
	if err == nil {
		_ = c.Close()
		return
	}
	if !strings.Contains(err.Error(), "unexpected protocol version") {
		return // the test's own connection reports it
	}
	msg := "no AMQP 1.0 listener at " + server + " (" + err.Error() + "): enable the rabbitmq_amqp1_0 plugin (rabbitmq-plugins enable rabbitmq_amqp1_0)"
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// sdkReceive reads one event from queue with the SDK's AMQP 1.0 receiver,
// as the SDK reads it (binding.ToEvent over its binding.Message), and
// settles it.
func sdkReceive(t *testing.T, ctx context.Context, u, queue string) (*ceevent.Event, error) {
	t.Helper()
	server, opts := amqp10Options(t, u)
	p, err := ceamqp.NewReceiverProtocol(server, "/amq/queue/"+queue, nil, nil, opts...)
	require.NoError(t, err, "AMQP 1.0 connection (is the rabbitmq_amqp1_0 plugin enabled?)")
	defer func() { _ = p.Close(context.Background()) }()
	m, err := p.Receive(ctx)
	require.NoError(t, err)
	e, err := binding.ToEvent(ctx, m)
	require.NoError(t, m.Finish(nil))
	return e, err
}

// TestCloudEventsRabbitMQReadBySDKAMQP10: with CloudEventsPrefix
// "cloudEvents:", what a publisher in CloudEvents mode sends is read by the
// SDK's AMQP 1.0 receiver (through RabbitMQ's AMQP 1.0 plugin) as valid
// events: id, type, source, time, subject, datacontenttype, partitionkey and
// data as pgrelay has them, pgrelay's other headers beside them. With the
// default prefix the SDK's binding does not recognise the message as a
// CloudEvent: it reads only "cloudEvents:".
func TestCloudEventsRabbitMQReadBySDKAMQP10(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	requireAMQP10(t, cfg.URL)
	cfg.WireFormat, cfg.CloudEventsSource, cfg.CloudEventsPrefix = broker.WireCloudEvents, "/billing", rabbitmq.CloudEventsPrefixColon
	p := newPublisher(t, cfg)
	ctx := ctxT(t, 30*time.Second)
	at := time.Date(2026, 11, 25, 10, 0, 0, 123456000, time.UTC)
	res := p.Publish(ctx, []pgrelay.Message{
		{EventID: "e-1", Topic: "orders", Key: "order-7", KeySeq: 4, EventType: "OrderPaid", ContentType: "application/json",
			Payload: []byte(`{"order_id":"order-7"}`), Headers: map[string]string{"tenant": "acme"}, OccurredAt: at},
	})
	require.NoError(t, res[0].Err)
	e, err := sdkReceive(t, ctx, cfg.URL, cfg.Queue)
	require.NoError(t, err)
	require.NoError(t, e.Validate())
	require.Equal(t, "e-1", e.ID())
	require.Equal(t, "1.0", e.SpecVersion())
	require.Equal(t, "OrderPaid", e.Type())
	require.Equal(t, "/billing", e.Source())
	require.True(t, at.Equal(e.Time()), "time %s", e.Time())
	require.Equal(t, "order-7", e.Subject())
	require.Equal(t, "application/json", e.DataContentType())
	require.Equal(t, "order-7", e.Extensions()["partitionkey"])
	require.JSONEq(t, `{"order_id":"order-7"}`, string(e.Data()))

	// The default prefix, "cloudEvents_": the SDK's AMQP binding sees no
	// CloudEvent (pgrelay's subscriber reads both, TestCloudEventsRabbitMQReadBySDK
	// reads it with the SDK's binding package).
	cfg2 := testConfig(t)
	cfg2.WireFormat = broker.WireCloudEvents
	p2 := newPublisher(t, cfg2)
	res = p2.Publish(ctx, []pgrelay.Message{{EventID: "e-2", Topic: "orders", EventType: "OrderPaid", Payload: []byte("{}")}})
	require.NoError(t, res[0].Err)
	_, err = sdkReceive(t, ctx, cfg2.URL, cfg2.Queue)
	require.ErrorIs(t, err, binding.ErrUnknownEncoding)
}

// TestCloudEventsRabbitMQSDKAMQP10EventApplied: events sent by the SDK's
// AMQP 1.0 sender to the exchange (through RabbitMQ's AMQP 1.0 plugin,
// which hands their application-properties to AMQP 0-9-1 consumers as one
// encoded header) are read by pgrelay's subscriber, stored in the inbox
// under their id and applied once, a resent one included; their attributes
// and extensions (string, integer, boolean) are kept.
func TestCloudEventsRabbitMQSDKAMQP10EventApplied(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	requireAMQP10(t, cfg.URL)
	pool := testdb.New(t)
	ctx := ctxT(t, 60*time.Second)
	// A subscriber declares the exchange and the queue; closed, so that the
	// consumer's own subscriber gets every message.
	decl, err := rabbitmq.NewSubscriber(ctx, cfg)
	require.NoError(t, err)
	_, err = decl.Fetch(ctx, 1, 10*time.Millisecond)
	require.NoError(t, err)
	require.NoError(t, decl.Close())

	server, opts := amqp10Options(t, cfg.URL)
	sender, err := ceamqp.NewSenderProtocol(server, "/exchange/"+cfg.Exchange+"/orders", nil, nil, opts...)
	require.NoError(t, err, "AMQP 1.0 connection (is the rabbitmq_amqp1_0 plugin enabled?)")
	t.Cleanup(func() { _ = sender.Close(context.Background()) })
	c, err := cloudevents.NewClient(sender)
	require.NoError(t, err)
	send := func(e ceevent.Event) {
		require.NoError(t, e.Validate())
		require.True(t, cloudevents.IsACK(c.Send(ctx, e)))
	}
	at := time.Date(2026, 1, 2, 3, 4, 5, 678000000, time.UTC) // AMQP timestamps keep milliseconds
	e1 := cloudevents.NewEvent()
	e1.SetID("sdk-1")
	e1.SetSource("urn:test:sdk")
	e1.SetType("OrderCreated")
	e1.SetSubject("orders/1")
	e1.SetTime(at)
	e1.SetExtension("partitionkey", "order-1")
	e1.SetExtension("tenant", "acme")
	e1.SetExtension("attempt", 7)
	e1.SetExtension("urgent", true)
	require.NoError(t, e1.SetData(cloudevents.ApplicationJSON, map[string]any{"order_id": "order-1"}))
	e2 := cloudevents.NewEvent()
	e2.SetID("sdk-2")
	e2.SetSource("urn:test:sdk")
	e2.SetType("Note")
	require.NoError(t, e2.SetData("text/plain", "hi"))
	send(e1)
	send(e1) // resent: a duplicate
	send(e2)

	cetest.Consume(t, pool, broker.Subscribe(rabbitmq.NewSubscriber, cfg))
	rows := cetest.WaitInbox(t, pool, 2)

	r1 := rows["sdk-1"]
	require.Equal(t, "processed", r1.Status, r1.LastError)
	require.Equal(t, "OrderCreated", r1.EventType)
	require.Equal(t, "order-1", r1.Key, "the partitionkey is the key")
	require.Equal(t, "orders", r1.Topic)
	require.True(t, at.Equal(r1.OccurredAt), "occurred at %s", r1.OccurredAt)
	require.JSONEq(t, `{"order_id":"order-1"}`, string(r1.Payload))
	require.Equal(t, "urn:test:sdk", r1.Headers["ce-source"])
	require.Equal(t, "orders/1", r1.Headers["ce-subject"])
	require.Equal(t, "acme", r1.Headers["ce-tenant"])
	require.Equal(t, "7", r1.Headers["ce-attempt"])
	require.Equal(t, "true", r1.Headers["ce-urgent"])
	require.Equal(t, "application/json", r1.Headers[event.HeaderContentType])
	for k := range r1.Headers {
		require.False(t, strings.HasPrefix(k, "x-amqp-1.0"), "the plugin's encoded sections are not headers: %s", k)
	}
	r2 := rows["sdk-2"]
	require.Equal(t, "processed", r2.Status, r2.LastError)
	require.Equal(t, "hi", string(r2.Payload))
	require.Len(t, rows, 2)
	require.Equal(t, map[string]int{"sdk-1": 1, "sdk-2": 1}, cetest.Applied(t, pool), "each event applied once")
}
