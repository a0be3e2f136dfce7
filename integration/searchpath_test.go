package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/ledger"
	ledgermigrations "github.com/pgrelay/pgrelay/internal/ledger/migrations"
	"github.com/pgrelay/pgrelay/internal/testcluster"
	"github.com/pgrelay/pgrelay/internal/testnats"
)

// TestBuiltinsResolveToPgCatalog: a role that may create functions in a
// schema on the search_path cannot have pgrelay call them. Every function
// and operator name pgrelay's SQL uses (queries/*.sql, the Go code's SQL,
// the bodies of pgrelay's functions) gets shadows in schema shadow, first on
// the database's search_path: each pg_catalog overload with its polymorphic
// types made concrete and its concrete arguments widened to text and to the
// types that cast to them implicitly, the exact matches that beat the
// built-in when a call names no schema. Then every path runs (Enqueue, Emit,
// the outbox triggers, pgrelay.emit, the relay with table and WAL capture,
// the consumer, the admin API and console, the CLI, retention), and no
// shadow may have been called. The statements also name pg_catalog in
// every call of a built-in function (docs/schema.md), and pgrelay's
// functions whose body is parsed at each call fix their search_path.
func TestBuiltinsResolveToPgCatalog(t *testing.T) {
	t.Parallel()
	dir := bins(t)
	c := testcluster.Start(t, "wal_level = logical\nmax_replication_slots = 10\nmax_wal_senders = 10\nmax_slot_wal_keep_size = '64MB'")
	dbURL := c.URL()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	setup, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	sqlDB := stdlib.OpenDBFromPool(setup)
	require.NoError(t, ledgermigrations.Up(ctx, sqlDB))
	require.NoError(t, sqlDB.Close())

	var builtins = map[string]bool{}
	rows, err := setup.Query(ctx, `SELECT DISTINCT proname FROM pg_proc WHERE pronamespace = 'pg_catalog'::regnamespace`)
	require.NoError(t, err)
	for rows.Next() {
		var n string
		require.NoError(t, rows.Scan(&n))
		builtins[n] = true
	}
	require.NoError(t, rows.Err())

	use := newSQLUse()
	nq := use.collectQueries(t, builtins)
	ng := use.collectGo(t, builtins)
	nf, unfixed := use.collectFunctions(t, ctx, setup, builtins)
	t.Logf("parsed %d queries, %d Go SQL strings, %d functions: %d function names, %d operators; %d SQL-looking strings did not parse: %v",
		nq, ng, nf, len(use.funcs), len(use.ops), len(use.unparsed), use.unparsed)
	require.Greater(t, nq, 100)
	require.Greater(t, ng, 20)

	n := plantShadows(t, ctx, setup, "postgres", use)
	setup.Close()
	t.Logf("planted %d shadows", n)

	pool := newPool(t, dbURL)
	// The control: a call that names no schema reaches a shadow.
	mark := len(c.Log())
	var v int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT nextval('pgrelay.outbox_id_seq')`).Scan(&v))
	require.Eventually(t, func() bool { return strings.Contains(c.Log()[mark:], shadowMark+" nextval(text)") }, 10*time.Second, 20*time.Millisecond,
		"an unqualified call did not reach its shadow: the test would prove nothing")
	mark = len(c.Log())

	// Reported even when a path fails (a shadow may be why).
	defer func() {
		called := map[string]bool{}
		for _, m := range regexp.MustCompile(shadowMark+` ([^\n]*)`).FindAllStringSubmatch(c.Log()[mark:], -1) {
			called[m[1]] = true
		}
		hits := make([]string, 0, len(called))
		for k := range called {
			hits = append(hits, k)
		}
		slices.Sort(hits)
		if len(hits) > 0 {
			lines := regexp.MustCompile(`(?m)^.*(`+shadowMark+`|STATEMENT).*$`).FindAllString(c.Log()[mark:], 400)
			t.Logf("server log, shadow calls:\n%s", strings.Join(lines, "\n"))
		}
		assert.Empty(t, hits, "shadows called: pgrelay resolved these through the search_path")
		assert.Empty(t, use.unqualified, "calls of built-in functions that name no schema")
		assert.Empty(t, unfixed, "pgrelay functions whose body, parsed at each call, resolves names through the caller's search_path")
	}()
	runEveryPath(t, ctx, dir, dbURL, pool)
}

// runEveryPath writes events every way a producer can, relays them with
// table and WAL capture, consumes them, and runs the operator's commands
// and the admin API's and console's reads and actions.
func runEveryPath(t *testing.T, ctx context.Context, dir, dbURL string, pool *pgxpool.Pool) {
	t.Helper()
	natsURL := testnats.URL(t)
	stream, prefix := testnats.Stream(t, natsURL)
	relayBin, consumerBin := filepath.Join(dir, "relay"), filepath.Join(dir, "consumer")

	order := func(i int) []byte {
		b, err := json.Marshal(ledger.OrderCreated{OrderID: fmt.Sprintf("o-%d", i), CustomerID: "c", AmountCents: int64(100 + i), Currency: "EUR"})
		require.NoError(t, err)
		return b
	}
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := pgrelay.Enqueue(ctx, tx,
			pgrelay.Message{Topic: "orders", Key: "o-1", EventType: ledger.EventOrderCreated, Payload: order(1)},
			pgrelay.Message{Topic: "orders", EventType: ledger.EventOrderCreated, Payload: order(2), Headers: map[string]string{"a": "b"}},
			pgrelay.Message{Topic: "orders", Key: "o-3", EventType: ledger.EventOrderCreated, Payload: order(3), NotBefore: time.Now().Add(-time.Second), ExpiresAt: time.Now().Add(time.Hour)}); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO pgrelay.outbox (topic, key, event_type, payload) VALUES ('orders', 'o-4', $1, $2)`, ledger.EventOrderCreated, order(4))
		return err
	}))
	// The same key again, in a repeatable read transaction (the trigger's other branch).
	require.NoError(t, pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
		return pgrelay.Enqueue(ctx, tx, pgrelay.Message{Topic: "orders", Key: "o-1", EventType: "OrderNoted", Payload: []byte(`{}`)})
	}))

	adminAddr := freeAddr(t)
	relay := startService(t, relayBin, []string{
		"DATABASE_URL=" + dbURL, "NATS_URL=" + natsURL, "RELAY_STREAM=" + stream, "RELAY_SUBJECT_PREFIX=" + prefix,
		"METRICS_ADDR=", "ADMIN_ADDR=" + adminAddr, "LOG_LEVEL=warn", "RELAY_RETENTION=1ms", "RELAY_RETENTION_INTERVAL=300ms",
	}, "run")
	require.Eventually(t, func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM pgrelay.outbox WHERE status = 'pending'`) == 0
	}, time.Minute, 50*time.Millisecond, "the table relay did not publish")

	consumerAdmin := freeAddr(t)
	cons := startService(t, consumerBin, consumerEnv(dbURL, natsURL, stream, prefix, "ADMIN_ADDR="+consumerAdmin, "LOG_LEVEL=warn"), "run")
	require.Eventually(t, func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox WHERE status IN ('processed', 'dead')`) >= 5
	}, time.Minute, 50*time.Millisecond, "the consumer did not process the events")

	// A dead event on each side, for the operator's commands (OrderNoted
	// went dead in the inbox: the ledger does not know it).
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := pgrelay.Enqueue(ctx, tx, pgrelay.Message{Topic: "orders.dead", Key: "d", EventType: "Dead", Payload: []byte(`{}`)}); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE pgrelay.outbox SET status = 'dead', last_error = 'boom' WHERE topic = 'orders.dead'`)
		return err
	}))

	for _, base := range []string{"http://" + adminAddr, "http://" + consumerAdmin} {
		for _, p := range []string{"/v1/stats", "/v1/inbox/dead", "/v1/outbox/dead", "/v1/audit", "/v1/dedup", "/v1/inbox/keys",
			"/v1/outbox/partitions", "/v1/inbox/conflicts", "/v1/inbox/gaps", "/console/", "/console/dead", "/console/outbox", "/console/dedup", "/console/keys"} {
			httpDo(t, "GET", base+p, "")
		}
		httpDo(t, "POST", base+"/v1/inbox/dead/requeue", `{"all": true, "dry_run": true, "reason": "test"}`)
		httpDo(t, "POST", base+"/v1/outbox/dead/requeue", `{"all": true, "dry_run": true, "reason": "test"}`)
		httpDo(t, "POST", base+"/v1/inbox/dead/purge", `{"older_than": "0s", "dry_run": true, "reason": "test"}`)
		httpDo(t, "POST", base+"/v1/outbox/dead/purge", `{"older_than": "0s", "dry_run": true, "reason": "test"}`)
	}

	env := []string{"DATABASE_URL=" + dbURL}
	for _, args := range [][]string{
		{"stats"}, {"dead", "list"}, {"outbox", "dead", "list"}, {"audit"}, {"conflicts"}, {"gaps", "list"}, {"migrate", "status"},
		{"dead", "requeue", "--all", "--reason", "r"}, {"outbox", "dead", "requeue", "--all", "--reason", "r"},
		{"dead", "purge", "--older-than", "0s", "--reason", "r", "--dry-run"}, {"outbox", "dead", "purge", "--older-than", "0s", "--reason", "r", "--dry-run"},
		{"audit"},
	} {
		cmd := exec.CommandContext(ctx, relayBin, args...)
		cmd.Env = append(cmd.Environ(), env...)
		out, err := cmd.CombinedOutput()
		assert.NoError(t, err, "relay %v: %s", args, out)
	}
	require.NoError(t, cons.stop())

	// WAL capture: Emit and pgrelay.emit, relayed from the slot.
	require.NoError(t, relay.stop())
	walRelay := startService(t, relayBin, []string{
		"DATABASE_URL=" + dbURL, "NATS_URL=" + natsURL, "RELAY_STREAM=" + stream, "RELAY_SUBJECT_PREFIX=" + prefix,
		"METRICS_ADDR=", "ADMIN_ADDR=", "LOG_LEVEL=warn", "RELAY_CAPTURE=wal", "RELAY_WAL_TRUNCATE_INTERVAL=300ms",
	}, "run")
	require.Eventually(t, func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'pgrelay' AND active`) == 1
	}, 30*time.Second, 50*time.Millisecond, "the WAL relay did not stream its slot")
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return pgrelay.Emit(ctx, tx, pgrelay.Message{Topic: "orders", Key: "o-5", EventType: ledger.EventOrderCreated, Payload: order(5)})
	}))
	_, err := pool.Exec(ctx, `SELECT pgrelay.emit('orders', $1::bytea, 'o-6', $2)`, order(6), ledger.EventOrderCreated)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO pgrelay.outbox_wal (topic, key, event_type, payload) VALUES ('orders', 'o-7', $1, $2)`, ledger.EventOrderCreated, order(7))
	require.NoError(t, err)
	startService(t, consumerBin, consumerEnv(dbURL, natsURL, stream, prefix, "LOG_LEVEL=warn"), "run")
	require.Eventually(t, func() bool {
		return !walRelay.running() ||
			queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox WHERE event_type = $1 AND status = 'processed'`, ledger.EventOrderCreated) >= 7
	}, 30*time.Second, 50*time.Millisecond, "the WAL relay's events were not consumed")
	require.True(t, walRelay.running(), "the WAL relay exited")
}

func httpDo(t *testing.T, method, url, body string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Less(t, resp.StatusCode, 500, "%s %s: %s", method, url, b)
}
