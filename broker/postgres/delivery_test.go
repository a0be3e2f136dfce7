package postgres_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/postgres"
	"github.com/pgrelay/pgrelay/consumer"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

func uuid() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// keyedEvents returns n events of each of keys, interleaved as an outbox
// holds them, with key sequences 1..n and random event ids (so that their
// order in the inbox's unique index is not their publish order).
func keyedEvents(keys []string, n int) []pgrelay.Message {
	var out []pgrelay.Message
	for i := range n {
		for _, k := range keys {
			out = append(out, pgrelay.Message{EventID: uuid(), Topic: "orders", Key: k, KeySeq: int64(i + 1),
				EventType: "Step", Payload: fmt.Appendf(nil, `{"key":%q,"seq":%d}`, k, i+1), OccurredAt: time.Now()})
		}
	}
	return out
}

func mustPublish(t *testing.T, p broker.Publisher, msgs []pgrelay.Message) []broker.Result {
	t.Helper()
	res := p.Publish(ctxT(t, 30*time.Second), msgs)
	for i, r := range res {
		if r.Err != nil {
			t.Fatalf("publish %s: %v", msgs[i].EventID, r.Err)
		}
	}
	return res
}

// TestDeliveryIdempotentAndInKeyOrder: the relay's batches are each
// delivered twice (a crash between publish and mark), and old batches once
// more by a second, fenced relay after the newer ones; a direct consumer runs
// the ordered workers of handler "a" concurrently, and "b" is subscribed too.
// Every event is stored once per handler, applied exactly once, and each
// key's events are applied in publish order.
func TestDeliveryIdempotentAndInKeyOrder(t *testing.T) {
	u := testdb.NewURL(t)
	pool, err := pgxpool.New(ctxT(t, 30*time.Second), u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctxT(t, 10*time.Second), `CREATE TABLE applied (n bigserial PRIMARY KEY, event_id text, key text, seq bigint)`); err != nil {
		t.Fatal(err)
	}
	c, err := consumer.New(consumer.Config{
		Pool: pool, Direct: true,
		Register: func(ctx context.Context) error {
			return postgres.Register(ctx, pool, postgres.Subscription{Handler: "a"}, postgres.Subscription{Handler: "b"})
		},
		Targets: []pgrelay.Target{{Handler: "a"}, {Handler: "b"}},
		Inbox: pgrelay.InboxConfig{HandlerName: "a", Workers: 4, BatchSize: 7, Ordered: true,
			PollInterval: 200 * time.Millisecond,
			Handler: pgrelay.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
				// The sequence as the payload carries it: the order the
				// events are applied in, whatever key_seq the inbox holds.
				_, err := tx.Exec(ctx, `INSERT INTO applied (event_id, key, seq) VALUES ($1, $2, ($3::jsonb->>'seq')::bigint)`,
					ev.EventID, ev.Key, string(ev.Payload))
				return err
			})},
		StatsInterval: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("consumer: %v", err)
		}
	})
	for end := time.Now().Add(30 * time.Second); !c.Ready(); {
		if time.Now().After(end) {
			t.Fatal("the direct consumer did not register its handlers")
		}
		time.Sleep(20 * time.Millisecond)
	}
	subs, err := postgres.Registered(ctxT(t, 10*time.Second), pool)
	if err != nil || len(subs) != 2 || subs[0].Handler != "a" || subs[1].Handler != "b" {
		t.Fatalf("registered %+v (%v), want handlers a and b", subs, err)
	}

	relay1, err := postgres.NewPublisher(ctxT(t, 30*time.Second), postgres.Config{URL: u})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = relay1.Close() })
	relay2, err := postgres.NewPublisher(ctxT(t, 30*time.Second), postgres.Config{Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{"k1", "k2", "k3", "k4", "k5", "k6"}
	const perKey = 30
	msgs := keyedEvents(keys, perKey)
	for b := 0; b < len(msgs); b += 20 {
		batch := msgs[b:min(b+20, len(msgs))]
		for _, r := range mustPublish(t, relay1, batch) {
			if r.Duplicate {
				t.Fatal("a first delivery was reported as a duplicate")
			}
		}
		for i, r := range mustPublish(t, relay1, batch) {
			if !r.Duplicate {
				t.Errorf("the repeated delivery of %s was not reported as a duplicate", batch[i].EventID)
			}
		}
	}
	// The fenced relay's late repeat of the first batches, in other
	// batch boundaries.
	mustPublish(t, relay2, msgs[:45])

	var applied int
	for end := time.Now().Add(30 * time.Second); applied < len(msgs); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%d of %d events applied", applied, len(msgs))
		}
		if err := pool.QueryRow(ctxT(t, 10*time.Second), `SELECT count(*) FROM applied`).Scan(&applied); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(500 * time.Millisecond) // anything applied twice would show by now
	rows, err := pool.Query(ctxT(t, 10*time.Second), `SELECT event_id, key, seq FROM applied ORDER BY n`)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	byKey := map[string][]int64{}
	for rows.Next() {
		var id, key string
		var seq int64
		if err := rows.Scan(&id, &key, &seq); err != nil {
			t.Fatal(err)
		}
		if seen[id] {
			t.Fatalf("event %s (%s #%d) applied twice", id, key, seq)
		}
		seen[id] = true
		byKey[key] = append(byKey[key], seq)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := make([]int64, perKey)
	for i := range want {
		want[i] = int64(i + 1)
	}
	for _, k := range keys {
		if !slices.Equal(byKey[k], want) {
			t.Fatalf("key %s applied in order %v, want %v", k, byKey[k], want)
		}
	}
	var stored []int
	for _, h := range []string{"a", "b"} {
		var n int
		if err := pool.QueryRow(ctxT(t, 10*time.Second), `SELECT count(*) FROM pgrelay.inbox WHERE handler = $1`, h).Scan(&n); err != nil {
			t.Fatal(err)
		}
		stored = append(stored, n)
	}
	if stored[0] != len(msgs) || stored[1] != len(msgs) {
		t.Fatalf("inbox rows of handlers a and b: %v, want %d each", stored, len(msgs))
	}
}

// TestPublishRefusesAlone: a message that can never be stored fails
// permanently and alone; the batch's others are stored. With no handler
// registered at all, a batch fails transiently.
func TestPublishRefusesAlone(t *testing.T) {
	u := testdb.NewURL(t)
	p, err := postgres.NewPublisher(ctxT(t, 30*time.Second), postgres.Config{URL: u, MaxMessageBytes: 100})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	msgs := keyedEvents([]string{"k"}, 4)
	res := p.Publish(ctxT(t, 30*time.Second), msgs)
	for i, r := range res {
		if r.Err == nil || broker.IsTerminal(r.Err) {
			t.Fatalf("message %d with no handler registered: %v, want a transient error", i, r.Err)
		}
	}
	pool := postgresPool(t, u)
	if err := postgres.Register(ctxT(t, 10*time.Second), pool, postgres.Subscription{Handler: "h", Topics: []string{"orders"}}); err != nil {
		t.Fatal(err)
	}
	msgs[1].Payload = make([]byte, 101)
	msgs[2].Topic = "payments"
	msgs[3].Headers = map[string]string{"Bad": "nul\x00"}
	res = p.Publish(ctxT(t, 30*time.Second), msgs)
	if res[0].Err != nil {
		t.Fatalf("the good message failed: %v", res[0].Err)
	}
	for i := 1; i < 4; i++ {
		if !broker.IsTerminal(res[i].Err) {
			t.Fatalf("message %d: %v, want a permanent error", i, res[i].Err)
		}
	}
	var n int
	if err := pool.QueryRow(ctxT(t, 10*time.Second), `SELECT count(*) FROM pgrelay.inbox`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d rows stored (%v), want 1", n, err)
	}
}

// TestNewPublisherNeedsMigratedTarget: a target without pgrelay's tables is
// refused at start-up, naming the setting.
func TestNewPublisherNeedsMigratedTarget(t *testing.T) {
	_, err := postgres.NewPublisher(ctxT(t, 30*time.Second), postgres.Config{URL: testdb.ServerURL(t)})
	if err == nil || !contains(err.Error(), "postgres.Config.URL") || !contains(err.Error(), "migrations") {
		t.Fatalf("got %v, want an error naming postgres.Config.URL and the migrations", err)
	}
	_, err = postgres.NewPublisher(ctxT(t, 30*time.Second), postgres.Config{})
	if err == nil || !contains(err.Error(), "postgres.Config.URL") {
		t.Fatalf("got %v, want postgres.Config.URL required", err)
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

// TestRegisteredTopicsAndKeys: each event is stored for the handlers whose
// topics take it, under each handler's own key strategy (per topic too);
// registering again replaces a handler's settings; a bad spec is refused.
func TestRegisteredTopicsAndKeys(t *testing.T) {
	u := testdb.NewURL(t)
	pool := postgresPool(t, u)
	err := postgres.Register(ctxT(t, 10*time.Second), pool, postgres.Subscription{Handler: "h", DedupKey: "nonsense:{x}"})
	if err == nil || !contains(err.Error(), "nonsense") {
		t.Fatalf("a bad key strategy: got %v", err)
	}
	if err := postgres.Register(ctxT(t, 10*time.Second), pool,
		postgres.Subscription{Handler: "all", DedupKeyByTopic: map[string]string{"payments": "business:pay:{order_id}"}},
		postgres.Subscription{Handler: "pay", Topics: []string{"payments"}}); err != nil {
		t.Fatal(err)
	}
	subs, err := postgres.Registered(ctxT(t, 10*time.Second), pool)
	if err != nil || len(subs) != 2 || subs[0].DedupKeyByTopic["payments"] != "business:pay:{order_id}" || !slices.Equal(subs[1].Topics, []string{"payments"}) {
		t.Fatalf("registered %+v (%v)", subs, err)
	}
	p, err := postgres.NewPublisher(ctxT(t, 30*time.Second), postgres.Config{Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	order := pgrelay.Message{EventID: uuid(), Topic: "orders", EventType: "OrderCreated", Payload: []byte(`{"order_id":"o1"}`)}
	pay := pgrelay.Message{EventID: uuid(), Topic: "payments", EventType: "OrderPaid", Payload: []byte(`{"order_id":"o1"}`)}
	// Another event id, the same business key: absorbed for "all" only.
	payAgain := pgrelay.Message{EventID: uuid(), Topic: "payments", EventType: "OrderPaid", Payload: []byte(`{"order_id":"o1"}`)}
	res := mustPublish(t, p, []pgrelay.Message{order, pay, payAgain})
	if res[0].Duplicate || res[1].Duplicate || res[2].Duplicate {
		t.Fatalf("results %+v: nothing was stored for every handler before", res)
	}
	rows, err := pool.Query(ctxT(t, 10*time.Second), `SELECT handler, event_id, dedup_key FROM pgrelay.inbox ORDER BY handler, event_id`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for rows.Next() {
		var h, id, key string
		if err := rows.Scan(&h, &id, &key); err != nil {
			t.Fatal(err)
		}
		got[h+"/"+id] = key
	}
	rows.Close()
	want := map[string]string{
		"all/" + order.EventID:    order.EventID,
		"all/" + pay.EventID:      "pay:o1",
		"pay/" + pay.EventID:      pay.EventID,
		"pay/" + payAgain.EventID: payAgain.EventID,
	}
	if len(got) != len(want) {
		t.Fatalf("stored %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("stored %v, want %v", got, want)
		}
	}
	// Registered again without topics: "pay" now takes orders too.
	if err := postgres.Register(ctxT(t, 10*time.Second), pool, postgres.Subscription{Handler: "pay"}); err != nil {
		t.Fatal(err)
	}
	order2 := pgrelay.Message{EventID: uuid(), Topic: "orders", EventType: "OrderCreated", Payload: []byte(`{}`)}
	mustPublish(t, p, []pgrelay.Message{order2})
	var n int
	if err := pool.QueryRow(ctxT(t, 10*time.Second), `SELECT count(*) FROM pgrelay.inbox WHERE event_id = $1`, order2.EventID).Scan(&n); err != nil || n != 2 {
		t.Fatalf("the order after re-registering is stored %d times (%v), want 2", n, err)
	}
	if ok, err := postgres.Unregister(ctxT(t, 10*time.Second), pool, "pay"); !ok || err != nil {
		t.Fatalf("unregister: %v %v", ok, err)
	}
}
