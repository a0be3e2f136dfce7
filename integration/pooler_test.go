package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/db"
	"github.com/pgrelay/pgrelay/internal/ledger"
	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/internal/testnats"
	"github.com/pgrelay/pgrelay/internal/testpgbouncer"
)

// produceOrders commits orders [from, to): per order, order_created and
// order_paid in one transaction each of perTx orders; it returns the cents
// paid.
func produceOrders(t *testing.T, pool *pgxpool.Pool, from, to, perTx int) int64 {
	t.Helper()
	ob, err := pgrelay.NewOutbox(pgrelay.OutboxConfig{})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var paid int64
	for start := from; start < to; start += perTx {
		var msgs []pgrelay.Message
		for i := start; i < min(start+perTx, to); i++ {
			id, amount := fmt.Sprintf("o-%05d", i), int64(100+i%977)
			created, err := json.Marshal(ledger.OrderCreated{OrderID: id, CustomerID: "c", AmountCents: amount, Currency: "EUR"})
			require.NoError(t, err)
			pay, err := json.Marshal(ledger.OrderPaid{OrderID: id, AmountCents: amount, Currency: "EUR"})
			require.NoError(t, err)
			msgs = append(msgs,
				pgrelay.Message{Topic: "orders", Key: id, EventType: ledger.EventOrderCreated, Payload: created},
				pgrelay.Message{Topic: "orders", Key: id, EventType: ledger.EventOrderPaid, Payload: pay})
			paid += amount
		}
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return ob.Enqueue(ctx, tx, msgs...) }))
	}
	return paid
}

// TestThroughPgBouncer runs the relay and the consumer as real processes
// through a stock PgBouncer (no ignore_startup_parameters) in transaction
// and in session mode (--pooler / DB_POOLER), SIGKILLs each of them mid-run
// and restarts it, and requires the ledger to be exact: every order
// credited once, every event stored and processed once.
func TestThroughPgBouncer(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{testpgbouncer.Transaction, testpgbouncer.Session} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			dir := bins(t)
			dbURL := testdb.NewURL(t)
			pgb := testpgbouncer.URL(t, dbURL, mode)
			pool := newPool(t, dbURL) // the application's own, direct
			natsURL := testnats.URL(t)
			stream, prefix := testnats.Stream(t, natsURL)

			relayBin, consumerBin := filepath.Join(dir, "relay"), filepath.Join(dir, "consumer")
			relayEnv := []string{
				"DATABASE_URL=" + pgb, "DB_POOLER=" + mode, "NATS_URL=" + natsURL, "RELAY_STREAM=" + stream,
				"RELAY_SUBJECT_PREFIX=" + prefix, "RELAY_LEASE=3s", "METRICS_ADDR=", "ADMIN_ADDR=", "LOG_LEVEL=warn",
			}
			env := consumerEnv(pgb, natsURL, stream, prefix, "DB_POOLER="+mode, "CONSUMER_LEASE=3s",
				"CONSUMER_HANDLER_TIMEOUT=1s", "LOG_LEVEL=warn")
			rel := startService(t, relayBin, relayEnv, "run")
			cons := startService(t, consumerBin, env, "run")

			const orders = 1000
			expected := produceOrders(t, pool, 0, orders/2, 50)
			require.Eventually(t, func() bool {
				return queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox`) > 200
			}, time.Minute, 20*time.Millisecond, "nothing reached the inbox through pgbouncer")
			cons.kill()
			t.Logf("consumer killed with %d of %d events in the inbox", queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox`), 2*orders)
			startService(t, consumerBin, env, "run")
			expected += produceOrders(t, pool, orders/2, 3*orders/4, 50)
			rel.kill()
			t.Logf("relay killed with %d outbox rows unpublished", queryInt(t, pool, `SELECT count(*) FROM pgrelay.outbox WHERE status <> 'published'`))
			startService(t, relayBin, relayEnv, "run")
			expected += produceOrders(t, pool, 3*orders/4, orders, 50)

			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			require.Eventually(t, func() bool {
				tot, err := db.New().LedgerTotals(ctx, pool)
				return err == nil && tot.Entries == orders && tot.TotalCents == expected &&
					queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox WHERE status = 'processed'`) == 2*orders
			}, 2*time.Minute, 100*time.Millisecond, "ledger never settled")
			require.Equal(t, int64(2*orders), queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox`), "every event stored once")
			require.Equal(t, int64(orders), queryInt(t, pool, `SELECT count(DISTINCT order_id) FROM ledger_entries`), "one credit per order")
			require.Equal(t, int64(2*orders), queryInt(t, pool, `SELECT count(*) FROM pgrelay.outbox WHERE status = 'published'`))
		})
	}
}

// TestPoolerStartupErrors: through a PgBouncer in transaction mode without
// --pooler, relay run and consumer run exit at start-up naming the refused
// start-up parameter and the setting, not "cannot reach PostgreSQL"; through
// one told to ignore those parameters they name the pooler and the setting,
// after each other too (their server connections hold each other's
// statements); migrate refuses the pooler.
func TestPoolerStartupErrors(t *testing.T) {
	t.Parallel()
	dir := bins(t)
	dbURL := testdb.NewURL(t)
	pgb := testpgbouncer.URL(t, dbURL, testpgbouncer.Transaction)
	ignoring := testpgbouncer.URL(t, dbURL, testpgbouncer.Transaction,
		"statement_timeout", "idle_in_transaction_session_timeout", "tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count")
	natsURL := testnats.URL(t)
	stream, prefix := testnats.Stream(t, natsURL)
	run := func(bin string, env []string, args ...string) string {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, filepath.Join(dir, bin), args...)
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		require.Error(t, err, "%s %v started through a pooler it was not told of:\n%s", bin, args, out)
		return string(out)
	}
	relay := func(url string) string {
		return run("relay", []string{"DATABASE_URL=" + url, "NATS_URL=" + natsURL, "RELAY_STREAM=" + stream, "RELAY_SUBJECT_PREFIX=" + prefix,
			"METRICS_ADDR=", "ADMIN_ADDR="}, "run")
	}
	consumer := func(url string) string { return run("consumer", consumerEnv(url, natsURL, stream, prefix), "run") }
	for _, c := range []struct{ out, want string }{
		{relay(pgb), "refused the start-up parameter"},
		{consumer(pgb), "refused the start-up parameter"},
		{relay(ignoring), "goes through a connection pooler"},
		{consumer(ignoring), "goes through a connection pooler"},
		{relay(ignoring), "goes through a connection pooler"},
	} {
		require.Contains(t, c.out, c.want)
		require.Contains(t, c.out, "set --pooler (DB_POOLER)")
		require.NotContains(t, c.out, "cannot reach PostgreSQL")
	}
	out := run("relay", []string{"DATABASE_URL=" + pgb}, "migrate", "up")
	require.Contains(t, out, "migrations need a direct connection to PostgreSQL")
	out = run("relay", []string{"DATABASE_URL=" + pgb, "DB_POOLER=transaction", "NATS_URL=" + natsURL, "RELAY_STREAM=" + stream,
		"RELAY_SUBJECT_PREFIX=" + prefix, "METRICS_ADDR=", "ADMIN_ADDR="}, "run", "--migrate")
	require.Contains(t, out, "migrations need a direct connection to PostgreSQL")
}

// TestPoolerLatency measures commit → ledger latency (the producer's
// transaction to the consumer's that credited the order, on the server's
// clock) at 20 orders a second, straight to PostgreSQL and through
// PgBouncer in session and transaction mode. A measurement, not a check:
// it runs with PGRELAY_POOLER_LATENCY=1 (docs/pooler.md quotes it).
func TestPoolerLatency(t *testing.T) {
	if os.Getenv("PGRELAY_POOLER_LATENCY") == "" {
		t.Skip("a measurement: set PGRELAY_POOLER_LATENCY=1")
	}
	dir := bins(t)
	for _, name := range []string{"none", testpgbouncer.Session, testpgbouncer.Transaction, "transaction+listen-url"} {
		t.Run(name, func(t *testing.T) {
			mode, listen := strings.CutSuffix(name, "+listen-url")
			dbURL := testdb.NewURL(t)
			url, extra := dbURL, []string{"DB_POOLER=" + mode}
			if mode != "none" {
				url = testpgbouncer.URL(t, dbURL, mode)
			}
			if listen {
				extra = append(extra, "DB_LISTEN_URL="+dbURL) // LISTEN straight to PostgreSQL
			}
			pool := newPool(t, dbURL)
			natsURL := testnats.URL(t)
			stream, prefix := testnats.Stream(t, natsURL)
			startService(t, filepath.Join(dir, "relay"), append([]string{
				"DATABASE_URL=" + url, "NATS_URL=" + natsURL, "RELAY_STREAM=" + stream,
				"RELAY_SUBJECT_PREFIX=" + prefix, "METRICS_ADDR=", "ADMIN_ADDR=", "LOG_LEVEL=warn",
			}, extra...), "run")
			startService(t, filepath.Join(dir, "consumer"), consumerEnv(url, natsURL, stream, prefix, append(extra, "LOG_LEVEL=warn")...), "run")
			time.Sleep(2 * time.Second) // both started
			const orders = 400
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			for i := range orders {
				<-tick.C
				produceOrders(t, pool, i, i+1, 1)
			}
			require.Eventually(t, func() bool {
				return queryInt(t, pool, `SELECT count(*) FROM ledger_entries`) == orders
			}, time.Minute, 50*time.Millisecond)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			rows, err := pool.Query(ctx, `SELECT extract(epoch FROM l.created_at - o.created_at)*1000
				FROM ledger_entries l JOIN pgrelay.outbox o ON o.event_id::text = l.event_id`)
			require.NoError(t, err)
			ms, err := pgx.CollectRows(rows, pgx.RowTo[float64])
			require.NoError(t, err)
			require.Len(t, ms, orders)
			slices.Sort(ms)
			load, _ := os.ReadFile("/proc/loadavg")
			t.Logf("%s: commit→ledger p50 %.1f ms, p99 %.1f ms, max %.1f ms (%d orders at 20/s; loadavg %s)",
				name, ms[len(ms)/2], ms[len(ms)*99/100], ms[len(ms)-1], orders, load[:min(len(load), 14)])
		})
	}
}
