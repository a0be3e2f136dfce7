package pgrelay_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/ledger"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// BenchmarkProcess measures the worker alone: 10,000 OrderPaid events already
// in the inbox, drained by the ledger handler (each event: a savepoint, an
// order lookup, a ledger insert and the processed mark, in batches).
func BenchmarkProcess(b *testing.B) {
	for _, workers := range []int{1, 4, 8} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				pool := testdb.New(b)
				createOrders(b, pool, orderIDs()...)
				var msgs []pgrelay.Incoming
				for i, id := range ids("pay", 10000) {
					msgs = append(msgs, orderPaid(id, fmt.Sprintf("o%d", i%50), 1))
				}
				for i := 0; i < len(msgs); i += 1000 {
					receive(b, pool, msgs[i:i+1000]...)
				}
				cfg := fastConfig(b, pool, ledger.Handler{})
				cfg.Workers, cfg.BatchSize, cfg.Logger = workers, 50, nil
				b.StartTimer()
				start := time.Now()
				stop := startWorker(b, cfg)
				waitAllDone(b, pool, 5*time.Minute)
				b.ReportMetric(10000/time.Since(start).Seconds(), "events/s")
				stop()
			}
		})
	}
}
