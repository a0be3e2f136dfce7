package nats

import (
	"testing"
	"time"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
)

// PublisherForTest returns a NATS publisher that is not connected, for its
// message mapping.
func PublisherForTest(subjectPrefix string) *Publisher {
	return &Publisher{cfg: pubConfig{SubjectPrefix: subjectPrefix}}
}

// RoundTripForTest encodes m as p publishes it (with its Nats-Msg-Id)
// and decodes it as the NATS subscriber does, stored at stream "S" seq 1.
func RoundTripForTest(t *testing.T, p *Publisher, m pgrelay.Message) broker.Delivery {
	t.Helper()
	msg := p.toNATS(m)
	msg.Header[MsgIDHeader] = []string{m.EventID}
	d, err := decodeNATS(natsMessage{Subject: msg.Subject, Header: msg.Header, Data: msg.Data,
		Stream: "S", StreamSeq: 1, StreamCreated: time.Unix(1, 0), Timestamp: time.Unix(2, 0)}, p.cfg.SubjectPrefix, 0)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	return d
}
