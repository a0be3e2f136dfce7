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
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/ledger"
	"github.com/pgrelay/pgrelay/internal/testcluster"
	"github.com/pgrelay/pgrelay/internal/testnats"
)

// TestFailoverMultiHostURL: migrate, the relay and the consumer are given
// one multi-host URL naming a hot standby first and its primary second, with
// target_session_attrs=read-write. Events flow through the primary; the
// primary crashes (immediate stop) and the standby is promoted; events
// enqueued on the new primary are published and applied by the same relay
// and consumer processes, without a restart.
func TestFailoverMultiHostURL(t *testing.T) {
	t.Parallel()
	dir := bins(t)
	pair := testcluster.StartPair(t, "")
	url := pair.URL()
	natsURL := testnats.URL(t)
	stream, prefix := testnats.Stream(t, natsURL)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	// migrate: pgrelay's migrations (already applied on this cluster) and
	// the example schema (not yet), through the URL.
	cmd := exec.CommandContext(ctx, filepath.Join(dir, "consumer"), "migrate", "up", "--example-schema")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+url)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)

	pool := newPool(t, url)
	relay := startService(t, filepath.Join(dir, "relay"), []string{
		"DATABASE_URL=" + url, "NATS_URL=" + natsURL, "RELAY_STREAM=" + stream, "RELAY_SUBJECT_PREFIX=" + prefix,
		"METRICS_ADDR=", "ADMIN_ADDR=", "LOG_LEVEL=warn",
	}, "run")
	consumer := startService(t, filepath.Join(dir, "consumer"), consumerEnv(url, natsURL, stream, prefix, "LOG_LEVEL=warn"), "run")

	credited := func(from, to int) bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM ledger_entries WHERE order_id >= $1 AND order_id < $2`,
			orderID(from), orderID(to)).Scan(&n)
		return err == nil && n == to-from
	}
	const before = 100
	for i := range before {
		require.NoError(t, enqueueOrder(ctx, pool, i))
	}
	require.Eventually(t, func() bool { return credited(0, before) }, time.Minute, 20*time.Millisecond, "credited before the failover")
	require.NoError(t, pair.CatchUp(ctx))

	require.NoError(t, pair.CrashPrimary(ctx))
	// Until the promotion, the URL's hosts are a standby, refused by
	// target_session_attrs, and a dead server: both services say so.
	for _, s := range []*service{relay, consumer} {
		require.Eventually(t, func() bool { return strings.Contains(s.Output(), "ValidateConnect failed: read only connection") },
			time.Minute, 20*time.Millisecond, "%s never met the standby", s.Name())
	}
	require.NoError(t, pair.Promote(ctx))
	promoted := time.Now()

	// The first order after the promotion: its enqueue retries until the
	// test's own pool reaches the new primary.
	require.Eventually(t, func() bool { return enqueueOrder(ctx, pool, before) == nil }, time.Minute, 20*time.Millisecond)
	enqueued := time.Since(promoted)
	require.Eventually(t, func() bool { return credited(before, before+1) }, 2*time.Minute, 20*time.Millisecond, "no credit after the failover")
	credit := time.Since(promoted)
	var published time.Time
	require.NoError(t, pool.QueryRow(ctx, `SELECT max(published_at) FROM pgrelay.outbox WHERE key = $1`, orderID(before)).Scan(&published))
	t.Logf("first order after the promotion: enqueued %s, published %s, credited %s after it", enqueued.Round(time.Millisecond),
		published.Sub(promoted).Round(time.Millisecond), credit.Round(time.Millisecond))

	const after = 100
	for i := before + 1; i < before+after; i++ {
		require.NoError(t, enqueueOrder(ctx, pool, i))
	}
	require.Eventually(t, func() bool { return credited(0, before+after) }, time.Minute, 20*time.Millisecond, "credited after the failover")
	require.True(t, relay.running(), "the relay ran through the failover")
	require.True(t, consumer.running(), "the consumer ran through the failover")
	require.Equal(t, int64(before+after), queryInt(t, pool, `SELECT count(*) FROM ledger_entries`), "one credit per order")
	require.Equal(t, int64(0), queryInt(t, pool, `SELECT count(*) FROM pgrelay.outbox WHERE status <> 'published'`))
	require.Eventually(t, func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox WHERE status <> 'processed'`) == 0
	}, time.Minute, 20*time.Millisecond, "inbox settled")
}

func orderID(i int) string { return fmt.Sprintf("o-%05d", i) }

// enqueueOrder enqueues order i created and paid, in one transaction.
func enqueueOrder(ctx context.Context, pool *pgxpool.Pool, i int) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return enqueueOrderTx(ctx, tx, i) })
}

// enqueueOrderTx enqueues order i created and paid in tx.
func enqueueOrderTx(ctx context.Context, tx pgx.Tx, i int) error {
	ob, err := pgrelay.NewOutbox(pgrelay.OutboxConfig{})
	if err != nil {
		return err
	}
	id, amount := orderID(i), int64(100+i)
	created, _ := json.Marshal(ledger.OrderCreated{OrderID: id, CustomerID: "c", AmountCents: amount, Currency: "EUR"})
	paid, _ := json.Marshal(ledger.OrderPaid{OrderID: id, AmountCents: amount, Currency: "EUR"})
	return ob.Enqueue(ctx, tx,
		pgrelay.Message{Topic: "orders", Key: id, EventType: ledger.EventOrderCreated, Payload: created},
		pgrelay.Message{Topic: "orders", Key: id, EventType: ledger.EventOrderPaid, Payload: paid})
}
