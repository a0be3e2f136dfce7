package broker

import (
	"testing"
	"time"
)

// NATSForTest returns a NATS publisher that is not connected, for its
// message mapping.
func NATSForTest(subjectPrefix string) *NATS {
	return &NATS{cfg: NATSConfig{SubjectPrefix: subjectPrefix}}
}

// NATSRoundTripForTest encodes m as p publishes it (with its Nats-Msg-Id)
// and decodes it as the NATS subscriber does, stored at stream "S" seq 1.
func NATSRoundTripForTest(t *testing.T, p *NATS, m Message) Delivery {
	t.Helper()
	msg := p.toNATS(m)
	msg.Header[NATSMsgIDHeader] = []string{m.EventID}
	d, err := decodeNATS(natsMessage{Subject: msg.Subject, Header: msg.Header, Data: msg.Data,
		Stream: "S", StreamSeq: 1, StreamCreated: time.Unix(1, 0), Timestamp: time.Unix(2, 0)}, p.cfg.SubjectPrefix, 0)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	return d
}
