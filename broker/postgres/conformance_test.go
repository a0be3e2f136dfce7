package postgres_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/brokertest"
	"github.com/pgrelay/pgrelay/broker/postgres"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// suiteMaxMessageBytes is the publishers' Config.MaxMessageBytes in the
// conformance suite.
const suiteMaxMessageBytes = 64 << 10

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// targets gives each namespace a target database of its own (a clone of
// the migrated template), with handler "c" registered for every topic.
type targets struct {
	mu  sync.Mutex
	dbs map[string]*pgxpool.Pool
	url map[string]string
}

func (ts *targets) get(t *testing.T, ns string) (string, *pgxpool.Pool) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if p, ok := ts.dbs[ns]; ok {
		return ts.url[ns], p
	}
	u := testdb.NewURL(t)
	p, err := pgxpool.New(ctxT(t, 30*time.Second), u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ts.mu.Lock()
		delete(ts.dbs, ns)
		ts.mu.Unlock()
		p.Close()
	})
	if err := postgres.Register(ctxT(t, 30*time.Second), p, postgres.Subscription{Handler: "c"}); err != nil {
		t.Fatal(err)
	}
	ts.dbs[ns], ts.url[ns] = p, u
	return u, p
}

// stored reads the rows of handler "c" in pool as deliveries: batch by
// batch (the transaction that stored them), and within one, as ordered
// apply takes a key's events: by key sequence.
func stored(t *testing.T, pool *pgxpool.Pool) []broker.Delivery {
	rows, err := pool.Query(ctxT(t, 10*time.Second), `
		SELECT handler, dedup_key, event_id, topic, key, coalesce(key_seq, 0), event_type, payload, headers, occurred_at,
		       CASE WHEN status = 'dead' THEN coalesce(last_error, 'dead') ELSE '' END
		FROM pgrelay.inbox WHERE handler = 'c'
		ORDER BY xmin::text::bigint, key, key_seq NULLS FIRST, dedup_key`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []broker.Delivery
	for rows.Next() {
		var d broker.Delivery
		var handler, key string
		var headers []byte
		m := &d.Message
		if err := rows.Scan(&handler, &key, &m.EventID, &m.Topic, &m.Key, &m.KeySeq, &m.EventType, &m.Payload, &headers,
			&m.OccurredAt, &d.DeadReason); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(headers, &m.Headers); err != nil {
			t.Fatal(err)
		}
		// As the inbox reads its rows: the content type and the trace
		// context are kept with the headers.
		for name, field := range map[string]*string{pgrelay.HeaderContentType: &m.ContentType,
			"traceparent": &m.TraceParent, "tracestate": &m.TraceState} {
			if v, ok := m.Headers[name]; ok {
				*field = v
				delete(m.Headers, name)
			}
		}
		m.OccurredAt = m.OccurredAt.UTC()
		d.Ref = fmt.Sprintf("inbox %s/%s", handler, key)
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// viaProxy returns u with its host replaced by addr.
func viaProxy(t *testing.T, u, addr string) string {
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	pu.Host = addr
	return pu.String()
}

func harness(ts *targets, proxy string) brokertest.Harness {
	h := brokertest.Harness{
		NewPublisher: func(t *testing.T, ns string) broker.Publisher {
			u, _ := ts.get(t, ns)
			if proxy != "" {
				u = viaProxy(t, u, proxy)
			}
			p, err := postgres.NewPublisher(ctxT(t, 30*time.Second), postgres.Config{URL: u, MaxMessageBytes: suiteMaxMessageBytes})
			if err != nil {
				t.Fatal(err)
			}
			return p
		},
		Stored: func(t *testing.T, ns string) []broker.Delivery {
			_, p := ts.get(t, ns)
			return stored(t, p)
		},
		// A database whose only handler takes another topic than the
		// suite's "orders".
		UnknownDestination: func(t *testing.T, ns string) broker.Publisher {
			u := testdb.NewURL(t)
			p, err := postgres.NewPublisher(ctxT(t, 30*time.Second), postgres.Config{URL: u})
			if err != nil {
				t.Fatal(err)
			}
			if err := postgres.Register(ctxT(t, 30*time.Second), postgresPool(t, u), postgres.Subscription{Handler: "c", Topics: []string{"payments"}}); err != nil {
				t.Fatal(err)
			}
			return p
		},
		MaxMessageBytes:   suiteMaxMessageBytes,
		ReportsDuplicates: true,
		RedeliveryTimeout: 10 * time.Second,
	}
	if proxy == "" {
		h.Proxied = func(t *testing.T) (brokertest.Harness, *toxiproxy.Proxy) {
			px := brokertest.StartProxy(t, serverAddr(t))
			return harness(ts, px.Listen), px
		}
	}
	return h
}

func postgresPool(t *testing.T, u string) *pgxpool.Pool {
	p, err := pgxpool.New(ctxT(t, 30*time.Second), u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// serverAddr is the host:port of the test server.
func serverAddr(t *testing.T) string {
	u, err := url.Parse(testdb.ServerURL(t))
	if err != nil {
		t.Fatal(err)
	}
	host := u.Host
	if u.Port() == "" {
		host += ":5432"
	}
	return host
}

// TestPostgresConformance runs the broker conformance suite against real
// PostgreSQL: Publish stores into a target database's inbox, read back as
// what was stored; the connection to the target is cut through a proxy.
func TestPostgresConformance(t *testing.T) {
	ts := &targets{dbs: map[string]*pgxpool.Pool{}, url: map[string]string{}}
	brokertest.Run(t, harness(ts, ""))
}
