package kafka

import (
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgrelay/pgrelay/broker"
)

// decodeRecord turns a record into a delivery with the broker-neutral decode
// rules (broker.Decode): the topic is the Kafka topic without "<prefix>."
// when the record has no topic header, and a record without a usable event id
// gets the stand-in FallbackEventID(topic, partition, offset).
func decodeRecord(prefix string, r *kgo.Record, opts broker.DecodeOptions) broker.Delivery {
	d, err := broker.Decode(broker.Received{
		Headers:    recordHeaders(r),
		Payload:    r.Value,
		Topic:      strings.TrimPrefix(r.Topic, prefix+"."),
		FallbackID: FallbackEventID(r.Topic, r.Partition, r.Offset),
		Timestamp:  r.Timestamp,
	}, opts)
	if err != nil {
		// Decode refuses only a message without a stand-in id, and every
		// record has one; keep the record's position as its id regardless.
		d.Message.EventID = FallbackEventID(r.Topic, r.Partition, r.Offset)
		d.DeadReason = err.Error()
	}
	d.Ref = ref(r)
	return d
}
