package brokertest

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
)

// BenchmarkPublish publishes batches of 100 events of 100 keys (a relay's
// batch under a backlog) to topic with p, and reports this process's CPU per
// message (user + system, where the platform tells it) beside the time per
// batch. An adapter runs it from a benchmark of its own package against its
// real broker; broker/nats's BenchmarkPublishBatch is the NATS one.
func BenchmarkPublish(b *testing.B, p broker.Publisher, topic string) {
	const batch = 100
	occurred := time.Now()
	msgs := make([]pgrelay.Message, batch)
	start, measured := processCPU()
	for n := 0; b.Loop(); n++ {
		for i := range msgs {
			msgs[i] = pgrelay.Message{
				EventID: "e-" + strconv.Itoa(n) + "-" + strconv.Itoa(i), Topic: topic, Key: "order-" + strconv.Itoa(i),
				EventType: "OrderPaid", Payload: []byte(`{"order_id":"order-1","amount_cents":100}`), OccurredAt: occurred, KeySeq: int64(n + 1),
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		for i, res := range p.Publish(ctx, msgs) {
			if res.Err != nil {
				cancel()
				b.Fatalf("message %d: %v", i, res.Err)
			}
		}
		cancel()
	}
	if end, ok := processCPU(); ok && measured {
		b.ReportMetric(float64(end-start)/float64(time.Microsecond)/float64(b.N*batch), "cpu-µs/msg")
	}
}
