package nats

import (
	"testing"
	"time"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
)

// CloudEventsPublisherForTest returns a NATS publisher in CloudEvents mode
// that is not connected, for its message mapping.
func CloudEventsPublisherForTest(subjectPrefix string) *Publisher {
	return &Publisher{cfg: pubConfig{SubjectPrefix: subjectPrefix, WireFormat: broker.WireCloudEvents}}
}

// RoundTripWireForTest is RoundTripForTest in p's wire format.
func RoundTripWireForTest(t *testing.T, p *Publisher, m pgrelay.Message) broker.Delivery {
	t.Helper()
	msg, err := p.wireMessage(m)
	if err != nil && m.EventType == "" && broker.IsTerminal(err) {
		t.Skip("no event type: not a CloudEvent, dead-lettered by the relay")
	}
	if err != nil {
		t.Fatalf("encode: %v", err)
	}
	msg.Header[MsgIDHeader] = []string{m.EventID}
	d, err := decodeNATS(natsMessage{Subject: msg.Subject, Header: msg.Header, Data: msg.Data,
		Stream: "S", StreamSeq: 1, StreamCreated: time.Unix(1, 0), Timestamp: time.Unix(2, 0)}, p.cfg.SubjectPrefix, 0)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	return d
}
