package kafka

import (
	"sort"
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
)

// toRecord maps an event onto a Kafka record: topic "<prefix>.<topic>", the
// event's key as the record key (so a key stays on one partition, in order),
// the payload as the value, and pgrelay's headers (broker.EncodeHeaders) as
// record headers, under the same names as on every other broker.
func toRecord(prefix string, m pgrelay.Message) *kgo.Record {
	eh := broker.EncodeHeaders(m)
	names := make([]string, 0, len(eh))
	for k := range eh {
		names = append(names, k)
	}
	sort.Strings(names) // the same record for the same event
	h := make([]kgo.RecordHeader, len(names))
	for i, k := range names {
		h[i] = kgo.RecordHeader{Key: k, Value: []byte(eh[k])}
	}
	// A non-nil key, even when empty, so that the key partitioner hashes it:
	// a nil key would be spread over partitions and lose its order.
	key := make([]byte, len(m.Key))
	copy(key, m.Key)
	return &kgo.Record{Topic: prefix + "." + m.Topic, Key: key, Value: m.Payload, Headers: h}
}

// recordSize is the size Kafka counts for a record in a batch, plus the batch
// header: what MaxMessageBytes bounds.
func recordSize(r *kgo.Record) int {
	const batchOverhead = 61 // v2 record batch header
	const recordOverhead = 21
	n := batchOverhead + recordOverhead + len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += 10 + len(h.Key) + len(h.Value)
	}
	return n
}

// recordHeaders returns a record's headers by name; a repeated name keeps its
// values in record order.
func recordHeaders(r *kgo.Record) map[string][]string {
	h := make(map[string][]string, len(r.Headers))
	for _, rh := range r.Headers {
		h[rh.Key] = append(h[rh.Key], string(rh.Value))
	}
	return h
}

// FallbackEventID is the stand-in event id of a record without a usable one:
// "kafka:<topic>:<partition>:<offset>", the same on every redelivery.
func FallbackEventID(topic string, partition int32, offset int64) string {
	return "kafka:" + topic + ":" + strconv.FormatInt(int64(partition), 10) + ":" + strconv.FormatInt(offset, 10)
}

// ref names a record's position for logs: "topic/partition@offset".
func ref(r *kgo.Record) string {
	return r.Topic + "/" + strconv.FormatInt(int64(r.Partition), 10) + "@" + strconv.FormatInt(r.Offset, 10)
}
