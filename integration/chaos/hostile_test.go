package chaos

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/db"
	"github.com/pgrelay/pgrelay/internal/ledger"
	"github.com/pgrelay/pgrelay/internal/proc"
	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/internal/testnats"
)

// testBinaries holds the relay and consumer, built once per test binary and
// removed by TestMain.
var testBinaries = proc.NewBinaries("./cmd/relay", "./cmd/consumer")

func binaries(t *testing.T) string {
	t.Helper()
	return testBinaries.Dir(t)
}

// TestHostileValuesEndToEnd sends hostile topics, keys, event types, headers
// and payloads (quotes, SQL, NUL bytes, invalid UTF-8, line breaks, huge and
// deeply nested values) through Enqueue, a relay process, NATS JetStream and a
// consumer process into the inbox. Each is either rejected by Enqueue with a
// clear error (and nothing written), or ends processed or dead with a reason,
// with its identity intact (or, when the broker refuses it, dead in the
// outbox with the broker's reason); nothing crashes, nothing is lost, and no value is
// ever executed as SQL.
func TestHostileValuesEndToEnd(t *testing.T) {
	t.Parallel()
	bin := binaries(t)
	dbURL := testdb.NewURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	defer pool.Close()
	natsURL := testnats.URL(t)
	stream, prefix := testnats.Stream(t, natsURL)
	work, err := os.MkdirTemp("", "pgrelay-hostile-")
	require.NoError(t, err)
	t.Cleanup(func() {
		if !t.Failed() {
			_ = os.RemoveAll(work)
		}
	})

	common := []string{"DATABASE_URL=" + dbURL, "NATS_URL=" + natsURL, "LOG_FORMAT=json", "METRICS_ADDR=", "ADMIN_ADDR="}
	relay := proc.New("relay", filepath.Join(bin, "relay"), []string{"run"},
		append(append([]string{}, common...), "RELAY_STREAM="+stream, "RELAY_SUBJECT_PREFIX="+prefix, "RELAY_LEASE=3s"), filepath.Join(work, "relay.log"))
	consumer := proc.New("consumer", filepath.Join(bin, "consumer"), []string{"run"},
		append(append([]string{}, common...), "CONSUMER_STREAM="+stream, "CONSUMER_SUBJECT_PREFIX="+prefix, "CONSUMER_DURABLE=hostile",
			"CONSUMER_MAX_WAIT=100ms", "CONSUMER_MAX_ATTEMPTS=3", "CONSUMER_LEASE=4s", "CONSUMER_HANDLER_TIMEOUT=2s"), filepath.Join(work, "consumer.log"))
	for _, p := range []*proc.Process{relay, consumer} {
		require.NoError(t, p.Start())
		defer func() { _ = p.Stop(20 * time.Second) }()
	}

	sqlish := `o'"; DROP TABLE ledger_entries; --`
	okPaid := func(order string, cents int64) []byte {
		return mustJSON(ledger.OrderPaid{OrderID: order, AmountCents: cents, Currency: "EUR"})
	}
	deep := []byte(strings.Repeat(`{"a":`, 100000) + "1" + strings.Repeat("}", 100000))
	cases := []struct {
		name string
		msg  pgrelay.Message
		// reject: Enqueue must refuse it; otherwise it must end processed
		// (credit true: exactly one ledger credit) or dead with a reason.
		reject bool
		credit bool
	}{
		{name: "SQL and quotes in the order id and key, created", msg: pgrelay.Message{Topic: "orders", Key: sqlish, EventType: ledger.EventOrderCreated,
			Payload: mustJSON(ledger.OrderCreated{OrderID: sqlish, CustomerID: `c"'\\`, AmountCents: 1234, Currency: "EUR"})}},
		{name: "SQL and quotes in the order id and key, paid", msg: pgrelay.Message{Topic: "orders", Key: sqlish, EventType: ledger.EventOrderPaid, Payload: okPaid(sqlish, 1234)}, credit: true},
		{name: "quote in the topic", msg: pgrelay.Message{Topic: `orders'"`, Payload: []byte("{}")}, reject: true},
		{name: "NUL in the topic", msg: pgrelay.Message{Topic: "ord\x00ers", Payload: []byte("{}")}, reject: true},
		{name: "wildcard topic", msg: pgrelay.Message{Topic: "orders.>", Payload: []byte("{}")}, reject: true},
		{name: "empty topic", msg: pgrelay.Message{Payload: []byte("{}")}, reject: true},
		{name: "NUL in the event id", msg: pgrelay.Message{EventID: "id\x00x", Topic: "orders", Payload: []byte("{}")}, reject: true},
		{name: "invalid UTF-8 event id", msg: pgrelay.Message{EventID: "id\xff", Topic: "orders", Payload: []byte("{}")}, reject: true},
		{name: "header name with a space", msg: pgrelay.Message{Topic: "orders", Headers: map[string]string{"A B": "x"}, Payload: []byte("{}")}, reject: true},
		{name: "header value with a line break", msg: pgrelay.Message{Topic: "orders", Headers: map[string]string{"Trace": "x\r\nNats-Msg-Id: forged"}, Payload: []byte("{}")}, reject: true},
		{name: "payload over the 1 MiB limit", msg: pgrelay.Message{Topic: "orders", Payload: make([]byte, 2<<20)}, reject: true},
		{name: "NUL in the key", msg: pgrelay.Message{Topic: "orders", Key: "k\x00y", EventType: ledger.EventOrderPaid, Payload: okPaid("x", 1)}, reject: true},
		{name: "invalid UTF-8 key", msg: pgrelay.Message{Topic: "orders", Key: "k\xff", EventType: ledger.EventOrderPaid, Payload: okPaid("x", 1)}, reject: true},
		{name: "NUL in a header value", msg: pgrelay.Message{Topic: "orders", Headers: map[string]string{"Trace": "a\x00b"}, Payload: []byte("{}")}, reject: true},
		{name: "quotes and unicode in a header value", msg: pgrelay.Message{Topic: "orders", EventType: "Unknown'\"", Headers: map[string]string{"Trace": `'"\ é 🎉`}, Payload: []byte("{}")}},
		{name: "huge key", msg: pgrelay.Message{Topic: "orders", Key: strings.Repeat("k", 100000), EventType: "Noise", Payload: []byte("{}")}, reject: true},
		{name: "key at the 1024-byte limit", msg: pgrelay.Message{Topic: "orders", Key: strings.Repeat("k", 1024), EventType: "Noise", Payload: []byte("{}")}},
		{name: "payload not UTF-8", msg: pgrelay.Message{Topic: "orders", EventType: ledger.EventOrderPaid, Payload: []byte{'{', 0xff, 0xfe, 0x00, '}'}}},
		{name: "payload with a NUL escape in a field", msg: pgrelay.Message{Topic: "orders", EventType: ledger.EventOrderCreated,
			Payload: []byte(`{"order_id":"a\u0000b","customer_id":"c","amount_cents":1,"currency":"EUR"}`)}},
		{name: "deeply nested JSON payload", msg: pgrelay.Message{Topic: "orders", EventType: ledger.EventOrderPaid, Payload: deep}},
		{name: "large payload under the limit", msg: pgrelay.Message{Topic: "orders", EventType: ledger.EventOrderPaid,
			Payload: []byte(`{"order_id":"` + strings.Repeat("x", 900<<10) + `","amount_cents":1,"currency":"EUR"}`)}},
		{name: "huge amount", msg: pgrelay.Message{Topic: "orders", EventType: ledger.EventOrderPaid,
			Payload: []byte(`{"order_id":"x","amount_cents":1e400,"currency":"EUR"}`)}},
		{name: "event type with quotes and a line break", msg: pgrelay.Message{Topic: "orders", EventType: "Order\"Paid'\r\nX: y", Payload: okPaid("x", 1)}, reject: true},
		{name: "key with a forged header line", msg: pgrelay.Message{Topic: "orders", Key: "k\r\nNats-Msg-Id: forged", Payload: okPaid("x", 1)}, reject: true},
	}
	accepted := map[string]int{} // event id -> case
	for i, c := range cases {
		m := c.msg
		if m.EventID == "" && !c.reject {
			m.EventID = newEventID()
		}
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return pgrelay.Enqueue(ctx, tx, m) })
		if c.reject {
			require.Error(t, err, c.name)
			require.NotEmpty(t, err.Error(), c.name)
			t.Logf("%-48s rejected: %.150s", c.name, err)
			continue
		}
		require.NoError(t, err, c.name)
		accepted[m.EventID] = i
	}
	var outboxRows int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pgrelay.outbox").Scan(&outboxRows)) // a one-off count in a test
	require.EqualValues(t, len(accepted), outboxRows, "a rejected message left a row behind")

	// Every accepted message ends processed or dead with a reason.
	var rows []db.ChaosInboxEventsRow
	var outboxDead map[string]string // events the relay could not publish, with the reason
	require.Eventually(t, func() bool {
		if !relay.Running() || !consumer.Running() {
			return true // reported below
		}
		qctx, qcancel := context.WithTimeout(ctx, 5*time.Second)
		defer qcancel()
		rows, err = db.New().ChaosInboxEvents(qctx, pool)
		if err != nil {
			return false
		}
		ob, err := db.New().ChaosOutboxEvents(qctx, pool)
		if err != nil {
			return false
		}
		settled := 0
		for _, r := range rows {
			if _, ok := accepted[r.EventID]; ok && (r.Status == "processed" || r.Status == "dead") {
				settled++
			}
		}
		outboxDead = map[string]string{}
		for _, o := range ob {
			if o.Status == "dead" && o.LastError != nil {
				outboxDead[o.EventID] = *o.LastError
				settled++
			}
		}
		return settled == len(accepted)
	}, 3*time.Minute, 250*time.Millisecond)
	require.True(t, relay.Running(), "the relay exited; see %s", work)
	require.True(t, consumer.Running(), "the consumer exited; see %s", work)

	credits, err := db.New().ChaosLedgerEntries(ctx, pool)
	require.NoError(t, err)
	byEvent := map[string]int{}
	for _, c := range credits {
		byEvent[c.EventID]++
	}
	got := map[string]db.ChaosInboxEventsRow{}
	for _, r := range rows {
		got[r.EventID] = r
	}
	for id, i := range accepted {
		c, r := cases[i], got[id]
		if reason, ok := outboxDead[id]; ok {
			t.Logf("%-48s dead in the outbox: %.150s", c.name, reason)
			require.NotEmpty(t, reason, c.name)
			require.False(t, c.credit, c.name)
			continue
		}
		reason := ""
		if r.LastError != nil {
			reason = *r.LastError
		}
		t.Logf("%-48s %s %.150s", c.name, r.Status, reason)
		require.Contains(t, []string{"processed", "dead"}, r.Status, c.name)
		if r.Status == "dead" {
			require.NotEmpty(t, reason, "%s: dead without a reason", c.name)
		}
		require.Equal(t, c.msg.EventType, r.EventType, "%s: event type changed on the way", c.name)
		if c.credit {
			require.Equal(t, "processed", r.Status, c.name)
			require.Equal(t, 1, byEvent[id], "%s: credits", c.name)
		}
	}
	// The SQL in the values was stored as data, never run.
	var entries int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM ledger_entries WHERE order_id = $1", sqlish).Scan(&entries)) // a one-off check in a test
	require.EqualValues(t, 1, entries)
}
