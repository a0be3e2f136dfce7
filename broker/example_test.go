package broker_test

import (
	"fmt"
	"time"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
)

// ExampleDecode is an adapter's receiving side: the headers EncodeHeaders
// gave a message, carried by the broker, decoded back into a Delivery. A
// message that cannot be used is still delivered, with a dead reason, so that
// the inbox stores it instead of losing it.
func ExampleDecode() {
	sent := pgrelay.Message{EventID: "evt-1", Topic: "orders", Key: "order-1", EventType: "OrderCreated",
		Payload: []byte(`{"order_id":"order-1"}`), OccurredAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	headers := map[string][]string{}
	for k, v := range broker.EncodeHeaders(sent) {
		headers[k] = []string{v}
	}
	d, err := broker.Decode(broker.Received{Headers: headers, Payload: sent.Payload}, broker.DecodeOptions{MaxPayloadBytes: 1 << 20})
	fmt.Println(d.Message.EventID, d.Message.Topic, d.Message.Key, d.Message.EventType, string(d.Message.Payload), d.DeadReason == "", err)

	delete(headers, "Pgrelay-Event-Type")
	d, _ = broker.Decode(broker.Received{Headers: headers, Payload: sent.Payload}, broker.DecodeOptions{})
	fmt.Println("dead:", d.DeadReason)
	// Output:
	// evt-1 orders order-1 OrderCreated {"order_id":"order-1"} true <nil>
	// dead: missing event type: no Pgrelay-Event-Type header
}
