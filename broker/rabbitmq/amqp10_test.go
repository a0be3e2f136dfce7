package rabbitmq

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

// TestCloudEventsAppPropertiesCodec: the application-properties section
// pgrelay writes decodes back to the same headers; the section RabbitMQ
// 3.10's AMQP 1.0 plugin stored for an event the CloudEvents Go SDK sent
// (str8 keys and values, an AMQP timestamp) decodes to the attributes'
// canonical strings; a cut or malformed section is an error, never a panic.
func TestCloudEventsAppPropertiesCodec(t *testing.T) {
	h := map[string]string{"cloudEvents:id": "e-1", "cloudEvents:time": "2026-11-25T10:00:00.123456Z", "Pgrelay-Topic": "orders", "empty": ""}
	enc := encodeAppProperties(h)
	got, err := decodeAppProperties(enc)
	require.NoError(t, err)
	require.Equal(t, h, got)

	fromPlugin := []byte("\x00St\xd1\x00\x00\x00\xa2\x00\x00\x00\f\xa1\x0ecloudEvents:id\xa1\x05sdk-1\xa1\x12cloudEvents:source\xa1\x05urn:x" +
		"\xa1\x17cloudEvents:specversion\xa1\x031.0\xa1\x10cloudEvents:type\xa1\x01T\xa1\x10cloudEvents:time\x83\x00\x00\x01\xa2\x14\x93~\x13" +
		"\xa1\x18cloudEvents:partitionkey\xa1\x02k1")
	got, err = decodeAppProperties(fromPlugin)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"cloudEvents:id": "sdk-1", "cloudEvents:source": "urn:x", "cloudEvents:specversion": "1.0",
		"cloudEvents:type": "T", "cloudEvents:time": "2026-11-25T21:19:00.115Z", "cloudEvents:partitionkey": "k1"}, got)

	scalars := []byte("\x00St\xc1\x00\x16" + "\xa1\x01a\x54\xf9" + "\xa1\x01b\x41" + "\xa1\x01c\x71\x00\x00\x01\x00" + "\xa1\x01d\xa0\x02\x00\xff" +
		"\xa1\x01e\x40" + "\xa1\x01f\x56\x00" + "\xa3\x01g\x81\xff\xff\xff\xff\xff\xff\xff\xfe" + "\xa1\x01h\x43" +
		"\xa1\x01i\x82\x3f\xf8\x00\x00\x00\x00\x00\x00" + "\xa1\x01j\x73\x00\x00\x00\xe9" +
		"\xa1\x01k\x98\x12\x34\x56\x78\x9a\xbc\xde\xf0\x12\x34\x56\x78\x9a\xbc\xde\xf0")
	got, err = decodeAppProperties(scalars)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"a": "-7", "b": "true", "c": "256", "d": "AP8=", "f": "false", "g": "-2", "h": "0",
		"i": "1.5", "j": "é", "k": "12345678-9abc-def0-1234-56789abcdef0"}, got)

	for _, whole := range [][]byte{enc, fromPlugin, scalars} {
		for n := range len(whole) {
			_, err := decodeAppProperties(whole[:n])
			require.Error(t, err, "cut at %d of %d", n, len(whole))
		}
	}
	_, err = decodeAppProperties([]byte("\x00St\xc1\x03\x01\xa1\x00"))
	require.ErrorContains(t, err, "map of 1 elements")
	_, err = decodeAppProperties([]byte("\x00St\xc1\x04\x02\xa1\x00\xe0"))
	require.ErrorContains(t, err, "unsupported AMQP 1.0 type 0xe0")
}

// TestCloudEventsAMQP10StandInID: two messages from AMQP 1.0 senders that
// differ only in their application-properties (in the plugin's
// x-amqp-1.0-app-properties header) get different stand-in ids; a header
// the server adds on redelivery still changes nothing.
func TestCloudEventsAMQP10StandInID(t *testing.T) {
	d := func(props map[string]string, count int) amqp.Delivery {
		return amqp.Delivery{Exchange: "x", RoutingKey: "orders", Body: []byte("{}"),
			Headers: amqp.Table{AppPropertiesHeader: string(encodeAppProperties(props)), "x-delivery-count": count}}
	}
	a := StandInID(d(map[string]string{"cloudEvents:type": "A"}, 0), "q")
	require.Equal(t, a, StandInID(d(map[string]string{"cloudEvents:type": "A"}, 3), "q"))
	require.NotEqual(t, a, StandInID(d(map[string]string{"cloudEvents:type": "B"}, 0), "q"))
}
