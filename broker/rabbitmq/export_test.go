package rabbitmq

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
)

// RoundTrip encodes m as the publisher does and decodes it as the subscriber
// does, the AMQP delivery built from the publishing's fields (the timestamp
// property at the second, as AMQP carries it). A message the publisher
// refuses permanently is skipped: it never reaches the broker.
func RoundTrip(t *testing.T, m pgrelay.Message) broker.Delivery {
	p, rk, err := encode(m, 0, DefaultMaxMessageBytes)
	if err != nil {
		if !broker.IsTerminal(err) {
			t.Fatalf("encode: a non-permanent error: %v", err)
		}
		t.Skipf("refused by the publisher: %v", err)
	}
	d := amqp.Delivery{
		Headers: p.Headers, ContentType: p.ContentType, DeliveryMode: p.DeliveryMode, MessageId: p.MessageId,
		Timestamp: p.Timestamp.Truncate(1e9), Type: p.Type, AppId: p.AppId, Exchange: "pgrelay", RoutingKey: rk,
		Body: p.Body, DeliveryTag: 1,
	}
	dv, err := broker.Decode(Received(d, "q"), broker.DecodeOptions{})
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	return dv
}
