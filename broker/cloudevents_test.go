package broker_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/internal/event"
)

func ceMessage() pgrelay.Message {
	return pgrelay.Message{EventID: "e-1", Topic: "orders", Key: "order-7", KeySeq: 3, EventType: "OrderPaid",
		Payload: []byte(`{"a":1}`), ContentType: "application/json",
		Headers:    map[string]string{"tenant": "acme", event.HeaderCausationID: "e-0", event.HeaderCorrelationID: "e-00"},
		OccurredAt: time.Date(2026, 11, 25, 10, 0, 0, 123456789, time.UTC)}
}

func received(h map[string]string, payload []byte) broker.Received {
	rh := make(map[string][]string, len(h))
	for k, v := range h {
		rh[k] = []string{v}
	}
	return broker.Received{Headers: rh, Payload: payload, FallbackID: "pos:1", Timestamp: time.Unix(5, 0).UTC()}
}

// TestCloudEventsHeadersPerBinding: each binding's binary mode carries the
// attributes under its prefix, datacontenttype where its binding puts it,
// and pgrelay's other headers unchanged.
func TestCloudEventsHeadersPerBinding(t *testing.T) {
	for _, tc := range []struct {
		name   string
		b      broker.CloudEventsBinding
		ctName string // "" : not in the headers
	}{
		{"nats", broker.CloudEventsNATS, "ce-datacontenttype"},
		{"kafka", broker.CloudEventsKafka, "content-type"},
		{"amqp", broker.CloudEventsAMQP, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := ceMessage()
			h, err := broker.CloudEventsHeaders(broker.EncodeHeaders(m), "/billing", tc.b)
			require.NoError(t, err)
			p := tc.b.Prefix
			want := map[string]string{
				p + "specversion": "1.0", p + "id": "e-1", p + "source": "/billing", p + "type": "OrderPaid",
				p + "time": "2026-11-25T10:00:00.123456789Z", p + "subject": "order-7", p + "partitionkey": "order-7",
				event.HeaderTopic: "orders", event.HeaderKeySeq: "3", event.HeaderPrefix + "tenant": "acme",
				event.HeaderCausationID: "e-0", event.HeaderCorrelationID: "e-00",
			}
			if tc.ctName != "" {
				want[tc.ctName] = "application/json"
			}
			require.Equal(t, want, h)
		})
	}
	_, err := broker.CloudEventsHeaders(broker.EncodeHeaders(pgrelay.Message{EventID: "x", Topic: "t"}), "", broker.CloudEventsNATS)
	require.ErrorContains(t, err, "no event type")
}

// TestCloudEventsRoundTrip: what a publisher writes in CloudEvents mode
// decodes to exactly the message pgrelay's own format gives (the relay's
// source is not part of the event), for every binding.
func TestCloudEventsRoundTrip(t *testing.T) {
	for _, b := range []broker.CloudEventsBinding{broker.CloudEventsNATS, broker.CloudEventsKafka, broker.CloudEventsAMQP} {
		m := ceMessage()
		h, err := broker.CloudEventsHeaders(broker.EncodeHeaders(m), "", b)
		require.NoError(t, err)
		r := received(h, m.Payload)
		if b.OmitContentType { // the AMQP adapter hands the content-type property back this way
			r.Headers[event.HeaderContentType] = []string{m.ContentType}
		}
		d, err := broker.Decode(r, broker.DecodeOptions{})
		require.NoError(t, err)
		require.Empty(t, d.DeadReason, b.Prefix)
		want := m
		want.Headers = map[string]string{"tenant": "acme", event.HeaderCausationID: "e-0", event.HeaderCorrelationID: "e-00"}
		want.OccurredAt = m.OccurredAt.Round(time.Microsecond) // PostgreSQL's precision, as in pgrelay's format
		require.Equal(t, want, d.Message, b.Prefix)
	}
}

// TestCloudEventsDecodeForeign: a CloudEvent written by another producer
// (mixed-case prefix, extensions, a subject that is not the key, no key
// sequence) is stored with its attributes kept as ce-* headers.
func TestCloudEventsDecodeForeign(t *testing.T) {
	d, err := broker.Decode(received(map[string]string{
		"cloudEvents:specversion": "1.0", "cloudEvents:id": "sdk-1", "cloudEvents:source": "urn:shop",
		"cloudEvents:type": "OrderCreated", "cloudEvents:time": "2026-01-02T03:04:05Z", "cloudEvents:subject": "orders/9",
		"cloudEvents:partitionkey": "9", "cloudEvents:traceparent": "00-abc-def-01", "cloudEvents:dataschema": "urn:schema",
		"ce_id": "not-this-prefix",
	}, []byte("x")), broker.DecodeOptions{})
	require.NoError(t, err)
	require.Empty(t, d.DeadReason)
	require.Equal(t, "sdk-1", d.Message.EventID)
	require.Equal(t, "OrderCreated", d.Message.EventType)
	require.Equal(t, "9", d.Message.Key)
	require.Zero(t, d.Message.KeySeq)
	require.Equal(t, time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), d.Message.OccurredAt)
	require.Equal(t, map[string]string{"ce-source": "urn:shop", "ce-subject": "orders/9", "ce-traceparent": "00-abc-def-01",
		"ce-dataschema": "urn:schema"}, d.Message.Headers, "headers without the prefix (ce_id here) are not attributes")

	// Kafka: datacontenttype in the content-type header.
	d, err = broker.Decode(received(map[string]string{"ce_specversion": "1.0", "ce_id": "k-1", "ce_source": "/s",
		"ce_type": "T", "content-type": "text/plain"}, []byte("hi")), broker.DecodeOptions{})
	require.NoError(t, err)
	require.Empty(t, d.DeadReason)
	require.Equal(t, "text/plain", d.Message.ContentType)
	require.Equal(t, "", d.Message.Key)
}

// TestCloudEventsInvalid: a CloudEvent without id, with another
// specversion or without source is stored dead, saying why, under its
// stand-in id; the broker's own message id never replaces a missing id
// attribute.
func TestCloudEventsInvalid(t *testing.T) {
	base := func() map[string]string {
		return map[string]string{"ce-specversion": "1.0", "ce-id": "i-1", "ce-source": "/s", "ce-type": "T"}
	}
	for _, tc := range []struct {
		name   string
		edit   func(map[string]string)
		reason string
	}{
		{"missing id", func(h map[string]string) { delete(h, "ce-id") }, "missing event id: no ce-id attribute"},
		{"bad specversion", func(h map[string]string) { h["ce-specversion"] = "0.3" }, `invalid CloudEvent: ce-specversion "0.3", want "1.0"`},
		{"missing source", func(h map[string]string) { delete(h, "ce-source") }, "invalid CloudEvent: no ce-source attribute"},
		{"missing type", func(h map[string]string) { delete(h, "ce-type") }, "missing event type: no ce-type attribute"},
		{"bad time", func(h map[string]string) { h["ce-time"] = "yesterday" }, "invalid occurred-at"},
		{"pgrelay id header ignored", func(h map[string]string) { delete(h, "ce-id"); h[event.HeaderEventID] = "p-1" }, "missing event id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := base()
			tc.edit(h)
			r := received(h, nil)
			r.BrokerID, r.BrokerIDName = "broker-id", "Nats-Msg-Id"
			d, err := broker.Decode(r, broker.DecodeOptions{})
			require.NoError(t, err)
			require.Contains(t, d.DeadReason, tc.reason)
			if strings.Contains(tc.name, "id") {
				require.Equal(t, "pos:1", d.Message.EventID)
			}
		})
	}
}

func TestCheckWire(t *testing.T) {
	for _, ok := range []string{"pgrelay", "/billing", "urn:example:orders", "https://example.com/x?y=1"} {
		_, err := broker.CheckWire(broker.WireCloudEvents, ok)
		require.NoError(t, err, ok)
	}
	f, err := broker.CheckWire("json", "")
	require.Equal(t, "WireFormat", f)
	require.ErrorContains(t, err, `"json" is not a wire format`)
	for _, bad := range []string{"has space", "caf\u00e9", "a\nb", strings.Repeat("x", 256), "%zz"} {
		f, err := broker.CheckWire(broker.WireCloudEvents, bad)
		require.Equal(t, "CloudEventsSource", f, bad)
		require.Error(t, err, bad)
	}
}
