package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/broker"
	pgnats "github.com/pgrelay/pgrelay/broker/nats"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/ledger"
	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/internal/testnats"
)

// TestMalformedInputGoesDead sends the consumer process every kind of
// malformed message. Each must end as a dead inbox row with its reason and its
// raw bytes, be acknowledged, and leave the consumer healthy: a good order
// sent afterwards is credited.
func TestMalformedInputGoesDead(t *testing.T) {
	t.Parallel()
	dir := bins(t)
	dbURL := testdb.NewURL(t)
	pool := newPool(t, dbURL)
	natsURL := testnats.URL(t)
	stream, prefix := testnats.Stream(t, natsURL)
	_, js := testnats.Connect(t, natsURL)
	httpAddr := freeAddr(t)
	svc := startService(t, filepath.Join(dir, "consumer"),
		consumerEnv(dbURL, natsURL, stream, prefix, "CONSUMER_MAX_PAYLOAD_BYTES=4096", "METRICS_ADDR="+httpAddr, "CONSUMER_ACK_WAIT=30s"), "run")

	type header = map[string]string
	good := func(id, typ string) header {
		return header{pgnats.MsgIDHeader: id, event.HeaderEventID: id, event.HeaderEventType: typ, event.HeaderTopic: "orders"}
	}
	with := func(h header, k, v string) header {
		out := header{}
		for a, b := range h {
			out[a] = b
		}
		if v == "" {
			delete(out, k)
		} else {
			out[k] = v
		}
		return out
	}
	cases := []struct {
		name    string
		headers header
		payload []byte
		id      string // the inbox row's event id; empty: the stream-sequence id
		reason  string // expected in last_error
	}{
		{"undecodable payload", good("bad-json", ledger.EventOrderPaid), []byte(`{"order_id": "o1", `), "bad-json", "not a JSON object"},
		{"wrong field type", good("bad-type", ledger.EventOrderPaid), []byte(`{"order_id":"o1","amount_cents":"ten","currency":"EUR"}`), "bad-type", "amount_cents"},
		{"missing field", good("bad-missing", ledger.EventOrderCreated), []byte(`{"order_id":"o1"}`), "bad-missing", "missing or empty field"},
		{"unknown event type", good("bad-unknown", "OrderRefunded"), []byte(`{"order_id":"o1"}`), "bad-unknown", "unknown event type"},
		{"missing event type", with(good("bad-notype", ""), event.HeaderEventType, ""), []byte(`{}`), "bad-notype", broker.ReasonMissingEventType},
		{"missing event id", header{event.HeaderEventType: ledger.EventOrderPaid}, []byte(`{"order_id":"o1","amount_cents":1,"currency":"EUR"}`), "", broker.ReasonMissingEventID},
		{"invalid event id", with(good("", ledger.EventOrderPaid), event.HeaderEventID, strings.Repeat("x", 300)), []byte(`{}`), "", broker.ReasonInvalidEventID},
		{"oversized", good("bad-big", ledger.EventOrderPaid), bytes.Repeat([]byte("a"), 5000), "bad-big", broker.ReasonPayloadTooLarge},
		{"invalid UTF-8", with(good("bad-utf8", ledger.EventOrderPaid), event.HeaderContentType, "application/json"), []byte{'{', 0xff, 0xfe, '}'}, "bad-utf8", broker.ReasonPayloadNotUTF8},
		{"bad occurred-at", with(good("bad-time", ledger.EventOrderPaid), event.HeaderOccurredAt, "tomorrow"), []byte(`{}`), "bad-time", broker.ReasonInvalidOccurredAt},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range cases {
		m := nats.NewMsg(prefix + ".orders")
		for k, v := range cases[i].headers {
			m.Header.Set(k, v)
		}
		m.Data = cases[i].payload
		ack, err := js.PublishMsg(ctx, m)
		require.NoError(t, err, cases[i].name)
		if cases[i].id == "" {
			info, err := js.Stream(ctx, stream)
			require.NoError(t, err)
			cases[i].id = pgnats.FallbackEventID(stream, info.CachedInfo().Created, ack.Sequence)
		}
	}

	for _, tc := range cases {
		require.Eventually(t, func() bool {
			return queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox WHERE event_id = $1 AND status = 'dead'`, tc.id) == 1
		}, 30*time.Second, 50*time.Millisecond, "%s: never dead", tc.name)
		var reason string
		var payload []byte
		require.NoError(t, pool.QueryRow(ctx, `SELECT last_error, payload FROM pgrelay.inbox WHERE event_id = $1`, tc.id).Scan(&reason, &payload))
		require.Contains(t, reason, tc.reason, tc.name)
		require.Equal(t, tc.payload, payload, "%s: raw bytes kept", tc.name)
	}

	// Still healthy: a good order is credited, and JetStream holds nothing
	// unacknowledged.
	publishJSON(t, js, prefix, "ok-created", ledger.EventOrderCreated, ledger.OrderCreated{OrderID: "ok", CustomerID: "c", AmountCents: 1234, Currency: "EUR"})
	publishJSON(t, js, prefix, "ok-paid", ledger.EventOrderPaid, ledger.OrderPaid{OrderID: "ok", AmountCents: 1234, Currency: "EUR"})
	require.Eventually(t, func() bool {
		return queryInt(t, pool, `SELECT coalesce(sum(amount_cents), 0) FROM ledger_entries`) == 1234
	}, 30*time.Second, 50*time.Millisecond)
	require.True(t, svc.running(), "the consumer survived every malformed input")
	require.Equal(t, int64(len(cases)), queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox WHERE status = 'dead'`))
	require.Eventually(t, func() bool {
		cons, err := js.Consumer(ctx, stream, "it")
		if err != nil {
			return false
		}
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0
	}, 30*time.Second, 50*time.Millisecond, "every message acknowledged")

	resp, err := http.Get("http://" + httpAddr + "/readyz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	resp, err = http.Get("http://" + httpAddr + "/metrics")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	// Dead at ingest: missing type, missing id, invalid id, oversized, not
	// UTF-8, bad occurred-at; the other four went dead in the handler.
	require.Contains(t, string(body), "\nconsumer_ingest_dead_total 6\n")
	// Exactly one delivery each: nothing was redelivered (AckWait 30s).
	require.Contains(t, string(body), "\nconsumer_received_total 12\n")

	require.NoError(t, svc.stop(), "graceful exit on SIGTERM")
}

func publishJSON(t *testing.T, js jetstream.JetStream, prefix, id, typ string, v any) {
	t.Helper()
	data, err := json.Marshal(v)
	require.NoError(t, err)
	m := nats.NewMsg(prefix + ".orders")
	m.Header.Set(pgnats.MsgIDHeader, id)
	m.Header.Set(event.HeaderEventID, id)
	m.Header.Set(event.HeaderEventType, typ)
	m.Header.Set(event.HeaderTopic, "orders")
	m.Data = data
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = js.PublishMsg(ctx, m)
	require.NoError(t, err)
}
