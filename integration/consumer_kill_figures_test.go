package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/ledger"
	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/internal/testnats"
)

// TestConsumerKillFigures measures how long events wait when a consumer is
// SIGKILLed while another keeps running (docs/consumer.md): one relay, two
// consumers on one durable with the default ack wait and claim lease (30 s
// each), 100 orders created a second; five times the second consumer is
// started, SIGKILLed 2 s later, and left dead for 2 s. It prints commit →
// processed p50, p99 and max, and how many events waited over 5 s at the
// broker (stored late: redelivered after the ack wait) or in the inbox
// (processed late: a claim taken over after its lease). Run with
// PGRELAY_TAKEOVER_FIGURES=1.
func TestConsumerKillFigures(t *testing.T) {
	if os.Getenv("PGRELAY_TAKEOVER_FIGURES") == "" {
		t.Skip("figures: set PGRELAY_TAKEOVER_FIGURES=1")
	}
	const kills, rate = 5, 100
	dir := bins(t)
	dbURL := testdb.NewURL(t)
	pool := newPool(t, dbURL)
	natsURL := testnats.URL(t)
	stream, prefix := testnats.Stream(t, natsURL)
	startService(t, filepath.Join(dir, "relay"), []string{
		"DATABASE_URL=" + dbURL, "NATS_URL=" + natsURL, "RELAY_STREAM=" + stream, "RELAY_SUBJECT_PREFIX=" + prefix,
		"METRICS_ADDR=", "ADMIN_ADDR=", "LOG_LEVEL=warn",
	}, "run")
	env := consumerEnv(dbURL, natsURL, stream, prefix, "CONSUMER_ACK_WAIT=30s", "LOG_LEVEL=warn")
	consumerBin := filepath.Join(dir, "consumer")
	startService(t, consumerBin, env, "run")

	ob, err := pgrelay.NewOutbox(pgrelay.OutboxConfig{})
	require.NoError(t, err)
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(time.Second / rate)
		defer tick.Stop()
		for i := 0; ctx.Err() == nil; i++ {
			<-tick.C
			id := fmt.Sprintf("o-%06d", i)
			b, _ := json.Marshal(ledger.OrderCreated{OrderID: id, CustomerID: "c", AmountCents: 100, Currency: "EUR"})
			m := pgrelay.Message{Topic: "orders", Key: id, EventType: ledger.EventOrderCreated, Payload: b}
			_ = pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error { return ob.Enqueue(context.Background(), tx, m) })
		}
	}()
	time.Sleep(3 * time.Second)
	for k := range kills {
		c := startService(t, consumerBin, env, "run")
		time.Sleep(2 * time.Second)
		c.kill()
		t.Logf("kill %d, load %s", k+1, loadAvg())
		time.Sleep(2 * time.Second)
	}
	stop()
	wg.Wait()
	require.Eventually(t, func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM pgrelay.outbox o LEFT JOIN pgrelay.inbox i ON i.event_id = o.event_id::text
			WHERE i.status IS DISTINCT FROM 'processed'`) == 0
	}, 2*time.Minute, 100*time.Millisecond, "every event processed")
	var n, storedLate, processedLate int
	var p50, p99, maxMs float64
	require.NoError(t, pool.QueryRow(context.Background(), `
		SELECT count(*)::int,
		       percentile_cont(0.5) WITHIN GROUP (ORDER BY d), percentile_cont(0.99) WITHIN GROUP (ORDER BY d), max(d),
		       count(*) FILTER (WHERE stored > 5000)::int, count(*) FILTER (WHERE processed > 5000)::int
		FROM (SELECT extract(epoch FROM i.finished_at - o.created_at) * 1000 AS d,
		             extract(epoch FROM i.received_at - o.created_at) * 1000 AS stored,
		             extract(epoch FROM i.finished_at - i.received_at) * 1000 AS processed
		      FROM pgrelay.outbox o JOIN pgrelay.inbox i ON i.event_id = o.event_id::text) s`).
		Scan(&n, &p50, &p99, &maxMs, &storedLate, &processedLate))
	t.Logf("FIGURES %d events, %d consumer SIGKILLs: commit → processed p50 %.0f ms, p99 %.0f ms, max %.0f ms; over 5 s: %d stored late (broker redelivery), %d processed late (inbox claim); load %s",
		n, kills, p50, p99, maxMs, storedLate, processedLate, loadAvg())
}

// loadAvg returns the 1, 5 and 15 minute load averages.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}
