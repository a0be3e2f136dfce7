package handlers_test

import (
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/handlers"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// BenchmarkHTTPDrain measures how fast the workers (the consumer's defaults:
// 4 workers, batches of 50) drain 2,000 stored events into a local webhook
// answering 204, at once or after a delay, with no failure or with 1.5 % of
// the events failing once. Each event costs a transaction of its own
// (pgrelay.ExternalHandler).
func BenchmarkHTTPDrain(b *testing.B) {
	const events = 2000
	for _, delay := range []time.Duration{0, 5 * time.Millisecond} {
		for _, failing := range []int{0, 30} {
			b.Run(fmt.Sprintf("delay=%s/failing=%d", delay, failing), func(b *testing.B) {
				for range b.N {
					b.StopTimer()
					pool := testdb.New(b)
					msgs := webhookEvents(events)
					var fail []string
					for i := range failing {
						fail = append(fail, msgs[i*events/failing+7].EventID)
					}
					hook := newCountingReceiver(fail...)
					hook.delay = delay
					srv := httptest.NewServer(hook)
					h, err := handlers.NewHTTP(handlers.HTTPConfig{URL: srv.URL, Timeout: time.Second, Recorder: pool})
					if err != nil {
						b.Fatal(err)
					}
					for i := 0; i < events; i += 500 {
						receive(b, pool, msgs[i:i+500]...)
					}
					cfg := testConfig(b, pool, h)
					cfg.Workers, cfg.BatchSize, cfg.Logger = pgrelay.DefaultWorkers, pgrelay.DefaultBatchSize, nil
					b.StartTimer()
					start := time.Now()
					startWorkerWith(b, cfg)
					waitProcessed(b, pool, events, 5*time.Minute)
					elapsed := time.Since(start)
					b.StopTimer()
					posts := 0
					for _, as := range hook.requests() {
						posts += len(as)
					}
					srv.Close()
					b.ReportMetric(events/elapsed.Seconds(), "events/s")
					b.ReportMetric(float64(posts)/events, "posts/event")
				}
			})
		}
	}
}
