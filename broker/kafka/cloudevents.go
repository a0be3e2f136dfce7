package kafka

import (
	"sort"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
)

// wireRecord is the record of m in the publisher's wire format: toRecord's,
// with its headers turned into CloudEvents binary mode ("ce_" attributes,
// content-type, broker.CloudEventsHeaders) under broker.WireCloudEvents. The
// record key is the event key in both formats, which is also the
// partitionkey attribute (the Kafka binding's key mapping). Its error is
// permanent (an event CloudEvents cannot carry).
func (p *Publisher) wireRecord(m pgrelay.Message) (*kgo.Record, error) {
	rec := toRecord(p.cfg.TopicPrefix, m)
	if p.cfg.WireFormat != broker.WireCloudEvents {
		return rec, nil
	}
	h := make(map[string]string, len(rec.Headers)+4)
	for _, rh := range rec.Headers {
		h[rh.Key] = string(rh.Value)
	}
	h, err := broker.CloudEventsHeaders(h, p.cfg.CloudEventsSource, broker.CloudEventsKafka)
	if err != nil {
		return nil, broker.Terminal(err)
	}
	names := make([]string, 0, len(h))
	for k := range h {
		names = append(names, k)
	}
	sort.Strings(names) // the same record for the same event
	rec.Headers = make([]kgo.RecordHeader, len(names))
	for i, k := range names {
		rec.Headers[i] = kgo.RecordHeader{Key: k, Value: []byte(h[k])}
	}
	return rec, nil
}
