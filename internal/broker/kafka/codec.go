package kafka

import (
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgrelay/pgrelay/internal/broker"
	"github.com/pgrelay/pgrelay/internal/event"
)

// toRecord maps an event onto a Kafka record: topic "<prefix>.<topic>", the
// event's key as the record key (so a key stays on one partition, in order),
// the payload as the value, and pgrelay's headers as record headers, under the
// same names as on every other broker.
func toRecord(prefix string, m broker.Message) *kgo.Record {
	h := make([]kgo.RecordHeader, 0, 6+len(m.Headers))
	add := func(k, v string) { h = append(h, kgo.RecordHeader{Key: k, Value: []byte(v)}) }
	add(event.HeaderEventID, m.EventID)
	add(event.HeaderTopic, m.Topic)
	add(event.HeaderKey, m.Key)
	if m.EventType != "" {
		add(event.HeaderEventType, m.EventType)
	}
	if !m.OccurredAt.IsZero() {
		add(event.HeaderOccurredAt, m.OccurredAt.UTC().Format(time.RFC3339Nano))
	}
	for k, v := range m.Headers {
		if k == event.HeaderCausationID || k == event.HeaderCorrelationID || k == event.HeaderContentType {
			if k == event.HeaderContentType && m.ContentType != "" {
				continue // ContentType below wins
			}
			add(k, v) // pgrelay's own headers, under their own names
			continue
		}
		add(event.HeaderPrefix+k, v)
	}
	if m.ContentType != "" {
		add(event.HeaderContentType, m.ContentType)
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
