package relay

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/event"
)

// TestWALFigures measures, on one private cluster in one run, the
// producer's commit with Emit against the same commit with Enqueue, and the
// commit-to-published latency of the WAL capture and of the table relay at
// 500 events/s. Set PGRELAY_WAL_FIGURES=1 to run it (it takes about a
// minute and wants an otherwise idle machine).
func TestWALFigures(t *testing.T) {
	if os.Getenv("PGRELAY_WAL_FIGURES") == "" {
		t.Skip("set PGRELAY_WAL_FIGURES=1 to measure")
	}
	b, _ := walSetup(t, walConf)
	ctx := context.Background()
	o, err := pgrelay.NewOutbox(pgrelay.OutboxConfig{})
	require.NoError(t, err)
	// The slot must exist for Emit's messages to be decoded; not for the
	// commit timing, but the WAL it keeps is part of the cost.
	_, err = b.pool.Exec(ctx, `SELECT pg_create_logical_replication_slot('figures', 'pgoutput')`)
	require.NoError(t, err)

	// 1. Commit cost: one event per transaction, alternating rounds.
	const rounds, perRound = 10, 300
	var enq, emit []time.Duration
	payload := []byte(`{"order_id":"o-1","amount":1234,"currency":"EUR","lines":[{"sku":"a","qty":1}]}`)
	for r := range rounds {
		for _, kind := range []string{"enqueue", "emit"} {
			for i := range perRound {
				m := pgrelay.Message{Topic: "orders", Key: fmt.Sprintf("k%d", i%50), EventType: "OrderPaid", ContentType: "application/json", Payload: payload}
				t0 := time.Now()
				err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
					if kind == "emit" {
						return o.Emit(ctx, tx, m)
					}
					return o.Enqueue(ctx, tx, m)
				})
				d := time.Since(t0)
				require.NoError(t, err)
				if r == 0 {
					continue // warm-up
				}
				if kind == "emit" {
					emit = append(emit, d)
				} else {
					enq = append(enq, d)
				}
			}
		}
	}
	pe, pm := pct(enq, 50), pct(emit, 50)
	t.Logf("commit, 1 event/tx, %d each: Enqueue p50 %v p99 %v | Emit p50 %v p99 %v | Enqueue/Emit p50 = %.2fx",
		len(enq), pe, pct(enq, 99), pm, pct(emit, 99), float64(pe)/float64(pm))
	_, err = b.pool.Exec(ctx, `SELECT pg_drop_replication_slot('figures'); TRUNCATE pgrelay.outbox`)
	require.NoError(t, err)

	// 2. Commit-to-published latency at 500 events/s.
	for _, capture := range []string{CaptureWAL, CaptureTable} {
		lat := latencyAt500(t, b, o, capture)
		t.Logf("%s capture, 500 events/s for 10s (%d events): commit->broker-stored p50 %v p90 %v p99 %v max %v",
			capture, len(lat), pct(lat, 50), pct(lat, 90), pct(lat, 99), pct(lat, 100))
	}
}

func latencyAt500(t *testing.T, b *bundle, o *pgrelay.Outbox, capture string) []time.Duration {
	ctx := context.Background()
	cfg := b.walConfig(t, b.publisher(t), nil)
	cfg.Capture = capture
	cfg.HeartbeatInterval = 300 * time.Millisecond
	r, stop := start(t, cfg)
	defer stop()
	if capture == CaptureWAL {
		waitReading(t, r)
	} else {
		time.Sleep(2 * time.Second) // partitions leased
	}
	var mu sync.Mutex
	done := make(chan struct{})
	const n = 5000
	committed := map[string]time.Time{} // committed, not received yet
	received := map[string]time.Time{}  // received before the producer saw its commit return
	var lat []time.Duration
	add := func(d time.Duration) { // with mu held
		lat = append(lat, max(d, 0))
		if len(lat) == n {
			close(done)
		}
	}
	cons, err := b.js.OrderedConsumer(ctx, b.stream, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverNewPolicy})
	require.NoError(t, err)
	cc, err := cons.Consume(func(m jetstream.Msg) {
		now := time.Now()
		id := m.Headers().Get(event.HeaderEventID)
		mu.Lock()
		defer mu.Unlock()
		if at, ok := committed[id]; ok {
			delete(committed, id)
			add(now.Sub(at))
		} else if _, dup := received[id]; !dup {
			received[id] = now
		}
	})
	require.NoError(t, err)
	defer cc.Stop()
	tick := time.NewTicker(2 * time.Millisecond) // 500/s
	defer tick.Stop()
	for i := range n {
		<-tick.C
		id := fmt.Sprintf("%s-%d-%d", capture, time.Now().UnixNano(), i)
		m := pgrelay.Message{EventID: id, Topic: "orders", Key: fmt.Sprintf("k%d", i%50), Payload: []byte("x")}
		require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			if capture == CaptureWAL {
				return o.Emit(ctx, tx, m)
			}
			return o.Enqueue(ctx, tx, m)
		}))
		at := time.Now()
		mu.Lock()
		if recv, ok := received[id]; ok {
			add(recv.Sub(at))
		} else {
			committed[id] = at
		}
		mu.Unlock()
	}
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatalf("%s: not every event arrived", capture)
	}
	mu.Lock()
	defer mu.Unlock()
	return slices.Clone(lat)
}

// pct returns the p-th percentile of ds.
func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := len(s) * p / 100
	if i >= len(s) {
		i = len(s) - 1
	}
	return s[i]
}
