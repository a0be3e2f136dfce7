package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	pgnats "github.com/pgrelay/pgrelay/broker/nats"
	"github.com/pgrelay/pgrelay/internal/db"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/ledger"
	"github.com/pgrelay/pgrelay/internal/testamqp"
	"github.com/pgrelay/pgrelay/internal/testcluster"
	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/internal/testnats"
)

// TestEndToEnd runs producer → relay → NATS JetStream → consumer → ledger
// with the relay and the consumer as real processes: 10,000 events (5,000
// orders created and paid), 2,000 duplicate deliveries injected straight
// into NATS under new broker ids, and the consumer killed with SIGKILL
// mid-run and restarted. The ledger must be exactly right, in count and sum,
// and every inbox row processed.
func TestEndToEnd(t *testing.T) {
	t.Parallel()
	dir := bins(t)
	dbURL := testdb.NewURL(t)
	pool := newPool(t, dbURL)
	natsURL := testnats.URL(t)
	stream, prefix := testnats.Stream(t, natsURL)
	_, js := testnats.Connect(t, natsURL)

	startService(t, filepath.Join(dir, "relay"), []string{
		"DATABASE_URL=" + dbURL, "NATS_URL=" + natsURL, "RELAY_STREAM=" + stream, "RELAY_SUBJECT_PREFIX=" + prefix,
		"METRICS_ADDR=", "ADMIN_ADDR=", "LOG_LEVEL=warn",
	}, "run")
	consumerBin := filepath.Join(dir, "consumer")
	env := consumerEnv(dbURL, natsURL, stream, prefix, "CONSUMER_LEASE=3s", "CONSUMER_HANDLER_TIMEOUT=1s", "LOG_LEVEL=warn")
	cons := startService(t, consumerBin, env, "run")

	const orders, perTx = 5000, 250
	ob, err := pgrelay.NewOutbox(pgrelay.OutboxConfig{})
	require.NoError(t, err)
	var expected int64
	produce := func(from, to int) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for start := from; start < to; start += perTx {
			for _, typ := range []string{ledger.EventOrderCreated, ledger.EventOrderPaid} {
				var msgs []pgrelay.Message
				for i := start; i < min(start+perTx, to); i++ {
					id, amount := fmt.Sprintf("o-%05d", i), int64(100+i%977)
					var payload any = ledger.OrderPaid{OrderID: id, AmountCents: amount, Currency: "EUR"}
					if typ == ledger.EventOrderCreated {
						payload = ledger.OrderCreated{OrderID: id, CustomerID: "c", AmountCents: amount, Currency: "EUR"}
					} else {
						expected += amount
					}
					b, err := json.Marshal(payload)
					require.NoError(t, err)
					msgs = append(msgs, pgrelay.Message{Topic: "orders", Key: id, EventType: typ, Payload: b})
				}
				require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return ob.Enqueue(ctx, tx, msgs...) }))
			}
		}
	}

	produce(0, orders/2)
	// Crash the consumer once it is busy, and restart it.
	require.Eventually(t, func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox`) > 1000
	}, time.Minute, 20*time.Millisecond)
	cons.kill()
	startService(t, consumerBin, env, "run")

	// Duplicates straight into NATS, under broker ids JetStream has not seen.
	require.Eventually(t, func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM pgrelay.outbox WHERE status = 'published'`) >= 2000
	}, time.Minute, 20*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rows, err := db.New().DemoOutboxEvents(ctx, pool, 2000)
	require.NoError(t, err)
	for _, r := range rows {
		m := nats.NewMsg(prefix + "." + r.Topic)
		m.Data = r.Payload
		m.Header.Set(pgnats.MsgIDHeader, "dup-"+r.EventID)
		m.Header.Set(event.HeaderEventID, r.EventID)
		m.Header.Set(event.HeaderEventType, r.EventType)
		m.Header.Set(event.HeaderTopic, r.Topic)
		m.Header.Set(event.HeaderKey, r.Key)
		_, err := js.PublishMsg(ctx, m)
		require.NoError(t, err)
	}

	produce(orders/2, orders)

	start := time.Now()
	require.Eventually(t, func() bool {
		tot, err := db.New().LedgerTotals(ctx, pool)
		return err == nil && tot.Entries == orders && tot.TotalCents == expected &&
			queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox WHERE status = 'processed'`) == 2*orders
	}, 3*time.Minute, 100*time.Millisecond, "ledger never settled")
	t.Logf("settled %s after the last event was produced", time.Since(start).Round(time.Millisecond))

	require.Equal(t, int64(2*orders), queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox`), "every event stored once")
	require.Equal(t, int64(0), queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox WHERE status <> 'processed'`))
	require.Equal(t, int64(orders), queryInt(t, pool, `SELECT count(DISTINCT order_id) FROM ledger_entries`), "one credit per order")
	require.Equal(t, int64(2*orders), queryInt(t, pool, `SELECT count(*) FROM pgrelay.outbox WHERE status = 'published'`))
	si, err := js.Stream(ctx, stream)
	require.NoError(t, err)
	info, err := si.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(2*orders+len(rows)), info.State.Msgs, "the duplicates reached the stream")
}

// TestDemo runs the demo binary in short mode, as a user would, and requires
// its verification to pass.
func TestDemo(t *testing.T) {
	t.Parallel()
	runDemo(t)
}

// TestDemoOnRabbitMQ runs the short demo on RabbitMQ (make demo
// BROKER=rabbitmq) and requires its verification to pass.
func TestDemoOnRabbitMQ(t *testing.T) {
	t.Parallel()
	runDemo(t, "--broker", "rabbitmq", "--amqp-url", testamqp.URL(t))
}

// TestDemoOnKafka runs the short demo on kfake, the in-memory Kafka the demo
// starts (make demo BROKER=kafka), and requires its verification to pass.
func TestDemoOnKafka(t *testing.T) {
	t.Parallel()
	runDemo(t, "--broker", "kafka")
}

// TestDemoWAL runs the short demo with the relay in WAL capture (make demo
// CAPTURE=wal): the producers emit to the WAL, and as the shared server keeps
// wal_level = replica the demo starts a private wal_level = logical cluster.
func TestDemoWAL(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat(filepath.Join(testcluster.BinDir(), "initdb")); err != nil {
		t.Skipf("no PostgreSQL server binaries for a private cluster: %v", err)
	}
	out := runDemo(t, "--capture", "wal")
	require.Contains(t, out, "[PASS] no outbox row (WAL capture)")
	require.Contains(t, out, "[PASS] every emitted event applied")
}

func runDemo(t *testing.T, args ...string) string {
	dir := bins(t)
	testdb.NewURL(t) // resolves the server (or skips/fails like every other test)
	name := fmt.Sprintf("pgrelay_demo_it_%d", time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(dir, "demo"), append([]string{"--short", "--bin-dir", dir,
		"--database", name, "--drop-database", "--work-dir", t.TempDir(), "--database-url", testdb.ServerURL(t)}, args...)...)
	cmd.Env = os.Environ()
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "RESULT: PASS") {
		t.Fatalf("demo failed: %v\n%s", err, out)
	}
	require.Contains(t, string(out), "[PASS] total credited == total paid")
	require.NotContains(t, string(out), "[FAIL]")
	return string(out)
}
