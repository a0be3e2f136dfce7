package kafka

import (
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgrelay/pgrelay/internal/broker"
	"github.com/pgrelay/pgrelay/internal/consumer"
	"github.com/pgrelay/pgrelay/internal/event"
)

// decode turns a record into a delivery with the consumer's decode rules; a
// record without a usable event id gets FallbackEventID.
func (s *Subscriber) decode(r *kgo.Record) broker.Delivery {
	return decodeRecord(s.cfg.TopicPrefix, r)
}

func decodeRecord(prefix string, r *kgo.Record) broker.Delivery {
	dec := consumer.Decode(consumer.Delivery{
		Subject: r.Topic, Header: recordHeaders(r), Data: r.Value,
		Stream: "kafka", StreamSeq: 1, Timestamp: r.Timestamp,
	}, consumer.DecodeOptions{SubjectPrefix: prefix})
	if strings.HasPrefix(dec.Message.EventID, "nats:") {
		dec.Message.EventID = FallbackEventID(r.Topic, r.Partition, r.Offset)
		if event.ValidateEventID(dec.Message.EventID) != nil {
			dec.Message.EventID = dec.Message.EventID[:event.MaxEventIDLen]
		}
	}
	return broker.Delivery{Message: dec.Message, DeadReason: dec.DeadReason, Ref: ref(r)}
}
