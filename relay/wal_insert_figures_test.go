package relay

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// TestWALInsertFigures measures, on one private cluster in one run, the
// producer's commit of a one-row transaction inserting into the trigger-less
// pgrelay.outbox_wal against the same insert into a plain table with the
// same columns and nothing else (no key, index, trigger or CHECK), from 8
// connections at once; and, for scale, a copy of outbox_wal with the
// outbox's five CHECKs (why the table has none) and the outbox's plain-SQL
// insert. The
// kinds take turns in every position of a round. Set
// PGRELAY_WAL_FIGURES=1 to run it (about a minute).
func TestWALInsertFigures(t *testing.T) {
	if os.Getenv("PGRELAY_WAL_FIGURES") == "" {
		t.Skip("set PGRELAY_WAL_FIGURES=1 to measure")
	}
	b, _ := walSetup(t, walConf)
	ctx := context.Background()
	// A slot and the publication as a WAL relay leaves them (not streaming:
	// the decoding's cost is not the producer's).
	_, err := b.pool.Exec(ctx, `SELECT pg_create_logical_replication_slot('figures', 'pgoutput');
		CREATE PUBLICATION figures FOR TABLE pgrelay.outbox_wal WITH (publish = 'insert');
		CREATE TABLE public.plain (event_id text, topic text, key text, event_type text, payload bytea, headers jsonb,
			occurred_at timestamptz DEFAULT now(), expires_at timestamptz, traceparent text, tracestate text);
		CREATE TABLE public.checked (LIKE pgrelay.outbox_wal INCLUDING DEFAULTS,
			CHECK (event_id <> '' AND octet_length(event_id) <= 255),
			CHECK (octet_length(topic) <= 255 AND topic ~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$'),
			CHECK (octet_length(key) <= 1024),
			CHECK (occurred_at > '0001-01-01 00:00:00+00' AND occurred_at < '10000-01-01 00:00:00+00'),
			CHECK (octet_length(traceparent) <= 255 AND octet_length(tracestate) <= 4096))`)
	require.NoError(t, err)
	const conns = 8
	pc, err := pgxpool.ParseConfig(b.dbURL)
	require.NoError(t, err)
	pc.MaxConns, pc.MinConns = conns, conns
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	require.NoError(t, err)
	defer pool.Close()
	payload := []byte(`{"order_id":"o-1","amount":1234,"currency":"EUR","lines":[{"sku":"a","qty":1}]}`)
	kinds := []struct{ name, sql string }{
		{"plain table", `INSERT INTO public.plain (event_id, topic, key, event_type, payload, headers) VALUES ($1, 'orders', $2, 'OrderPaid', $3, '{"Pgrelay-Content-Type":"application/json"}')`},
		{"pgrelay.outbox_wal", `INSERT INTO pgrelay.outbox_wal (event_id, topic, key, event_type, payload, headers) VALUES ($1, 'orders', $2, 'OrderPaid', $3, '{"Pgrelay-Content-Type":"application/json"}')`},
		{"same with outbox's CHECKs", `INSERT INTO public.checked (event_id, topic, key, event_type, payload, headers) VALUES ($1, 'orders', $2, 'OrderPaid', $3, '{"Pgrelay-Content-Type":"application/json"}')`},
		{"pgrelay.outbox (triggers)", `INSERT INTO pgrelay.outbox (event_id, topic, key, event_type, payload, headers) VALUES ($1, 'orders', $2, 'OrderPaid', $3, '{"Pgrelay-Content-Type":"application/json"}')`},
	}
	lat := make([][]time.Duration, len(kinds))
	count := make([]int, len(kinds))
	spent := make([]time.Duration, len(kinds))
	const rounds, per = 6, 3 * time.Second
	seq := 0
	for r := range rounds {
		for j := range kinds {
			k := (j + r) % len(kinds) // each kind in each position in turn
			kind := kinds[k]
			var mu sync.Mutex
			var wg sync.WaitGroup
			t0 := time.Now()
			end := t0.Add(per)
			n := 0
			for c := range conns {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var mine []time.Duration
					for i := 0; time.Now().Before(end); i++ {
						id := fmt.Sprintf("r%d-%d-c%d-%d-%d", r, k, c, i, seq)
						s0 := time.Now()
						err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
							_, err := tx.Exec(ctx, kind.sql, id, fmt.Sprintf("k%d", i%50), payload)
							return err
						})
						if err != nil {
							t.Error(err)
							return
						}
						mine = append(mine, time.Since(s0))
					}
					mu.Lock()
					defer mu.Unlock()
					n += len(mine)
					if r > 0 { // the first round warms up
						lat[k] = append(lat[k], mine...)
					}
				}()
			}
			wg.Wait()
			if r > 0 {
				count[k] += n
				spent[k] += time.Since(t0)
			}
			seq++
		}
	}
	base := float64(count[0]) / spent[0].Seconds()
	for k, kind := range kinds {
		rate := float64(count[k]) / spent[k].Seconds()
		t.Logf("%-26s %d conns, 1 row/tx: %7.0f commits/s (%.2fx the plain table), p50 %v p99 %v",
			kind.name, conns, rate, rate/base, pct(lat[k], 50), pct(lat[k], 99))
	}
}
