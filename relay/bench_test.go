package relay

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgrelay/pgrelay"
	"github.com/stretchr/testify/require"
)

// BenchmarkRelayThroughput measures one relay publishing a backlog of 20,000
// committed rows (64 keys) to JetStream, acknowledgements awaited, marks
// committed. Run: go test -run '^$' -bench RelayThroughput -benchtime 1x ./relay/
func BenchmarkRelayThroughput(b *testing.B) {
	const rows = 20000
	for range b.N {
		b.StopTimer()
		bt := setupB(b)
		for i := 0; i < rows; i += 1000 {
			batch := make([]pgrelay.Message, 1000)
			for j := range batch {
				batch[j] = pgrelay.Message{EventID: fmt.Sprintf("b-%d", i+j), Topic: "orders", Key: fmt.Sprintf("key-%d", (i+j)%64), Payload: []byte(`{"order_id":"12345","amount_cents":1999,"currency":"EUR"}`)}
			}
			bt.enqueue(b, batch...)
		}
		obs := &countingObserver{}
		cfg := bt.testConfig(nil, bt.publisherB(b), obs)
		r, err := newEngine(cfg)
		require.NoError(b, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		b.StartTimer()
		began := time.Now()
		go func() { done <- r.run(ctx) }()
		for bt.count(b, "published") < rows {
			time.Sleep(5 * time.Millisecond) // polling a benchmark's end condition
		}
		elapsed := time.Since(began)
		b.StopTimer()
		cancel()
		require.NoError(b, <-done)
		b.ReportMetric(float64(rows)/elapsed.Seconds(), "events/s")
	}
}

// BenchmarkEnqueue compares the batch insert Enqueue uses (one INSERT over
// unnest'ed arrays) with COPY, for 100 events per transaction.
func BenchmarkEnqueue(b *testing.B) {
	for _, mode := range []string{"unnest", "copy"} {
		b.Run(mode, func(b *testing.B) {
			bt := setupB(b)
			ctx := context.Background()
			o, err := newOutboxForTest()
			require.NoError(b, err)
			n := 0
			for b.Loop() {
				msgs := make([]pgrelay.Message, 100)
				rows := make([][]any, 100)
				for j := range msgs {
					n++
					msgs[j] = pgrelay.Message{EventID: fmt.Sprintf("%s-%d", mode, n), Topic: "orders", Key: fmt.Sprintf("key-%d", n%64), Payload: []byte(`{"order_id":"12345"}`)}
					rows[j] = []any{msgs[j].EventID, "orders", msgs[j].Key, msgs[j].Payload}
				}
				err := pgx.BeginFunc(ctx, bt.pool, func(tx pgx.Tx) error {
					if mode == "unnest" {
						return o.Enqueue(ctx, tx, msgs...)
					}
					_, err := tx.CopyFrom(ctx, pgx.Identifier{"pgrelay", "outbox"}, []string{"event_id", "topic", "key", "payload"}, pgx.CopyFromRows(rows))
					return err
				})
				require.NoError(b, err)
			}
			b.ReportMetric(float64(b.N*100)/b.Elapsed().Seconds(), "events/s")
		})
	}
}
