package pgrelay_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// BenchmarkReceive measures Receive (one INSERT ... SELECT unnest(...) ON
// CONFLICT DO NOTHING) against the alternative it was chosen over: COPY into a
// temporary table, then INSERT ... SELECT ... ON CONFLICT DO NOTHING, in one
// transaction. Half of each batch is a redelivery of the previous batch.
func BenchmarkReceive(b *testing.B) {
	pool := testdb.New(b)
	for _, size := range []int{10, 100, 1000} {
		b.Run(fmt.Sprintf("unnest/batch=%d", size), func(b *testing.B) {
			benchReceive(b, pool, size, func(ctx context.Context, msgs []pgrelay.Incoming) error {
				_, err := pgrelay.Receive(ctx, pool, msgs)
				return err
			})
		})
		b.Run(fmt.Sprintf("copy/batch=%d", size), func(b *testing.B) {
			benchReceive(b, pool, size, func(ctx context.Context, msgs []pgrelay.Incoming) error {
				return receiveByCopy(ctx, pool, msgs)
			})
		})
	}
}

func benchReceive(b *testing.B, pool *pgxpool.Pool, size int, recv func(context.Context, []pgrelay.Incoming) error) {
	ctx := context.Background()
	n := 0
	prev := make([]pgrelay.Incoming, 0, size/2)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		msgs := append([]pgrelay.Incoming(nil), prev...)
		prev = prev[:0]
		for len(msgs) < size {
			m := orderPaid(fmt.Sprintf("%s-%d-%d", b.Name(), i, n), "o1", 100)
			n++
			msgs = append(msgs, m)
			if len(prev) < size/2 {
				prev = append(prev, m)
			}
		}
		if err := recv(ctx, msgs); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*size)/b.Elapsed().Seconds(), "msgs/s")
}

// receiveByCopy is the benchmark's alternative implementation. Dynamic SQL:
// it exists only to be measured.
func receiveByCopy(ctx context.Context, pool *pgxpool.Pool, msgs []pgrelay.Incoming) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `CREATE TEMP TABLE inbox_in (event_id text, topic text, key text, event_type text,
			payload bytea, occurred_at timestamptz) ON COMMIT DROP`); err != nil {
			return err
		}
		rows := make([][]any, len(msgs))
		for i, m := range msgs {
			rows[i] = []any{m.EventID, m.Topic, m.Key, m.EventType, m.Payload, m.OccurredAt}
		}
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{"inbox_in"},
			[]string{"event_id", "topic", "key", "event_type", "payload", "occurred_at"}, pgx.CopyFromRows(rows)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO pgrelay.inbox (event_id, topic, key, event_type, payload, occurred_at)
			SELECT DISTINCT ON (event_id) event_id, topic, key, event_type, payload, coalesce(occurred_at, now())
			FROM inbox_in ON CONFLICT (handler, dedup_key) DO NOTHING`)
		return err
	})
}

// BenchmarkReceiveDuplicateRecord measures what recording duplicates costs:
// Receive with the record (inbox_duplicates and inbox_receive_counts written
// by the insert statement) against the same statement with the record
// switched off. Half of each batch is a redelivery of the previous batch, so
// every batch records size/2 duplicates.
func BenchmarkReceiveDuplicateRecord(b *testing.B) {
	pool := testdb.New(b)
	for _, size := range []int{10, 100, 1000} {
		for _, record := range []bool{true, false} {
			name := fmt.Sprintf("record=%t/batch=%d", record, size)
			b.Run(name, func(b *testing.B) {
				benchReceive(b, pool, size, func(ctx context.Context, msgs []pgrelay.Incoming) error {
					_, err := pgrelay.ReceiveWith(ctx, pool, msgs, pgrelay.ReceiveOptions{Targets: []pgrelay.Target{{Handler: "bench"}}, NoDuplicateRecord: !record})
					return err
				})
			})
		}
	}
}
