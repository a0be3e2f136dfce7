package nats_test

import (
	"context"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
)

// BenchmarkPublishBatch publishes batches of 100 events of 100 keys (a
// relay's batch under a backlog) to JetStream and reports this process's CPU
// per message (user + system, from getrusage) beside the time per batch.
func BenchmarkPublishBatch(b *testing.B) {
	p, _ := newNATS(b)
	const batch = 100
	occurred := time.Now()
	msgs := make([]pgrelay.Message, batch)
	cpu := func() time.Duration {
		var ru syscall.Rusage
		require.NoError(b, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	b.ResetTimer()
	start := cpu()
	for n := 0; b.Loop(); n++ {
		for i := range msgs {
			msgs[i] = pgrelay.Message{
				EventID: "e-" + strconv.Itoa(n) + "-" + strconv.Itoa(i), Topic: "orders", Key: "order-" + strconv.Itoa(i),
				EventType: "OrderPaid", Payload: []byte(`{"order_id":"order-1","amount_cents":100}`), OccurredAt: occurred, KeySeq: int64(n + 1),
			}
		}
		for i, res := range p.Publish(context.Background(), msgs) {
			if res.Err != nil {
				b.Fatalf("message %d: %v", i, res.Err)
			}
		}
	}
	b.ReportMetric(float64(cpu()-start)/float64(time.Microsecond)/float64(b.N*batch), "cpu-µs/msg")
}
