package pgrelay_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

func receiveFor(t testing.TB, pool *pgxpool.Pool, targets []pgrelay.Target, msgs ...pgrelay.Incoming) pgrelay.ReceiveResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := pgrelay.ReceiveFor(ctx, pool, targets, msgs)
	require.NoError(t, err)
	return res
}

func payment(id, order string, cents int) pgrelay.Incoming {
	return pgrelay.Incoming{Message: pgrelay.Message{EventID: id, Topic: "payments", Key: order, EventType: "PaymentRequested",
		Payload: fmt.Appendf(nil, `{"order_id":%q,"amount_cents":%d}`, order, cents)}}
}

// effects records each handler's side effect in its own table row: the test
// counts them per handler and event.
func effectsTable(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `CREATE TABLE effects (handler text NOT NULL, event_id text NOT NULL, dedup_key text NOT NULL)`)
	require.NoError(t, err)
}

func effectHandler(name string, fail func(*pgrelay.InboxEvent) error) pgrelay.InboxHandler {
	return pgrelay.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
		if ev.Handler != name {
			return pgrelay.Permanent(fmt.Errorf("handler %s was given a row of %s", name, ev.Handler))
		}
		if fail != nil {
			if err := fail(ev); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO effects (handler, event_id, dedup_key) VALUES ($1, $2, $3)`, name, ev.EventID, ev.DedupKey)
		return err
	})
}

// TestHandlersEachProcessOnce: one event stored for two handlers is
// processed once by each, each with its own status and dead letters; a
// redelivery is absorbed once per handler.
func TestHandlersEachProcessOnce(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	effectsTable(t, pool)
	targets := []pgrelay.Target{{Handler: "ledger"}, {Handler: "mail"}}
	res := receiveFor(t, pool, targets, payment("e1", "o1", 100), payment("e2", "o2", 200))
	require.Equal(t, 4, res.Inserted, "one row per message and handler")
	res = receiveFor(t, pool, targets, payment("e1", "o1", 100))
	require.Zero(t, res.Inserted)
	require.Equal(t, []string{"e1"}, res.Duplicates)
	require.Len(t, res.Absorbed, 2, "absorbed once per handler")
	require.Empty(t, res.Conflicts())

	// The mail handler rejects e2 for good: only its own row goes dead.
	mailFails := func(ev *pgrelay.InboxEvent) error {
		if ev.EventID == "e2" {
			return pgrelay.Permanent(errors.New("mailbox gone"))
		}
		return nil
	}
	for _, h := range []struct {
		name string
		fail func(*pgrelay.InboxEvent) error
	}{{"ledger", nil}, {"mail", mailFails}} {
		cfg := fastConfig(t, pool, effectHandler(h.name, h.fail))
		cfg.HandlerName = h.name
		startWorker(t, cfg)
	}
	waitAllDone(t, pool, 20*time.Second)
	require.Equal(t, 1, queryInt(t, pool, `SELECT count(*) FROM effects WHERE handler = 'ledger' AND event_id = 'e1'`))
	require.Equal(t, 1, queryInt(t, pool, `SELECT count(*) FROM effects WHERE handler = 'ledger' AND event_id = 'e2'`))
	require.Equal(t, 1, queryInt(t, pool, `SELECT count(*) FROM effects WHERE handler = 'mail' AND event_id = 'e1'`))
	require.Equal(t, 0, queryInt(t, pool, `SELECT count(*) FROM effects WHERE handler = 'mail' AND event_id = 'e2'`))
	require.Equal(t, 1, queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox WHERE status = 'dead' AND handler = 'mail' AND event_id = 'e2'`))
	require.Equal(t, 1, queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox WHERE status = 'processed' AND handler = 'ledger' AND event_id = 'e2'`))
	require.Equal(t, 4, queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox`))
}

// TestStrategiesDeduplicateByTheirKey: the same double-clicked payment (two
// event ids, one order) is stored once under a business key and twice under
// the message id; the rows carry their key and strategy.
func TestStrategiesDeduplicateByTheirKey(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	targets := []pgrelay.Target{
		{Handler: "by-order", DedupKey: "business:payment:{order_id}"},
		{Handler: "by-id"},
		{Handler: "by-content", DedupKey: "content-hash:order_id,amount_cents"},
	}
	res := receiveFor(t, pool, targets, payment("click-1", "o-9", 500), payment("click-2", "o-9", 500))
	require.Equal(t, 4, res.Inserted, "by-order 1, by-id 2, by-content 1")
	require.Empty(t, res.Conflicts(), "same content: no conflict")
	require.Equal(t, 1, queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox WHERE handler = 'by-order'`))
	require.Equal(t, 2, queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox WHERE handler = 'by-id'`))
	require.Equal(t, 1, queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox WHERE handler = 'by-content'`))
	var key, spec, id string
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT dedup_key, key_strategy, event_id FROM pgrelay.inbox WHERE handler = 'by-order'`).Scan(&key, &spec, &id))
	require.Equal(t, "payment:o-9", key)
	require.Equal(t, "business:payment:{order_id}", spec)
	require.Equal(t, "click-1", id, "the first event's row stands")
	require.Equal(t, 2, queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox WHERE handler = 'by-id' AND dedup_key = event_id AND key_strategy = 'message-id'`))

	// Later in another batch: absorbed by the key too.
	res = receiveFor(t, pool, targets, payment("click-3", "o-9", 500))
	require.Equal(t, 1, res.Inserted, "only by-id stores a third row")
}

// TestConflictsAreRecorded: a key stored with another payload fingerprint is
// a conflict, recorded with both event ids, whether the stored row is from an
// earlier batch or earlier in the same batch; the stored row stands. The same
// payload again is a plain duplicate.
func TestConflictsAreRecorded(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	targets := []pgrelay.Target{{Handler: pgrelay.DefaultHandlerName}, {Handler: "by-order", DedupKey: "business:pay:{order_id}"}}
	receiveFor(t, pool, targets, payment("e1", "o1", 100))
	res := receiveFor(t, pool, targets, payment("e1", "o1", 100))
	require.Empty(t, res.Conflicts(), "a redelivery with the same payload is no conflict")

	res = receiveFor(t, pool, targets, payment("e1", "o1", 999))
	conflicts := res.Conflicts()
	require.Len(t, conflicts, 2, "same event id, other payload: a conflict for both handlers")
	for _, c := range conflicts {
		require.Equal(t, "e1", c.StoredEventID)
		require.Equal(t, "e1", c.EventID)
	}
	res = receiveFor(t, pool, targets, payment("e2", "o1", 300), payment("e3", "o2", 1), payment("e4", "o2", 2))
	conflicts = res.Conflicts()
	require.Len(t, conflicts, 2, "o1 against the stored e1, and e4 against e3 in the same batch")
	got := map[string]string{}
	for _, c := range conflicts {
		require.Equal(t, "by-order", c.Handler)
		got[c.EventID] = c.StoredEventID
	}
	require.Equal(t, map[string]string{"e2": "e1", "e4": "e3"}, got)

	require.Equal(t, 4, queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox_conflicts`))
	require.Equal(t, 1, queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox_conflicts
		WHERE handler = 'by-order' AND dedup_key = 'pay:o1' AND stored_event_id = 'e1' AND event_id = 'e2'
		  AND stored_fingerprint = sha256('{"order_id":"o1","amount_cents":100}') AND payload = '{"order_id":"o1","amount_cents":300}'`))
	require.Equal(t, 1, queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox WHERE handler = 'by-order' AND dedup_key = 'pay:o1'
		AND event_id = 'e1' AND payload = '{"order_id":"o1","amount_cents":100}'`), "the first event stands")
}

// TestConcurrentDeliveriesStoreOnce: the same event received ten times at
// once (a retry storm) is stored once; the others are absorbed, without
// conflict. With ten different payloads under one key, exactly nine
// conflicts are recorded, each naming the stored event: rows committed while
// an insert waited are compared too.
func TestConcurrentDeliveriesStoreOnce(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	targets := []pgrelay.Target{{Handler: "h", DedupKey: "business:pay:{order_id}"}}
	run := func(msgs func(i int) pgrelay.Incoming) (inserted, absorbed, conflicts int) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range 10 {
			wg.Go(func() {
				<-start
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				res, err := pgrelay.ReceiveFor(ctx, pool, targets, []pgrelay.Incoming{msgs(i)})
				require.NoError(t, err)
				mu.Lock()
				defer mu.Unlock()
				inserted += res.Inserted
				absorbed += len(res.Absorbed)
				conflicts += len(res.Conflicts())
			})
		}
		close(start)
		wg.Wait()
		return
	}
	inserted, absorbed, conflicts := run(func(int) pgrelay.Incoming { return payment("storm", "o1", 100) })
	require.Equal(t, 1, inserted)
	require.Equal(t, 9, absorbed)
	require.Zero(t, conflicts)
	inserted, absorbed, conflicts = run(func(i int) pgrelay.Incoming { return payment(fmt.Sprintf("race-%d", i), "o2", i) })
	require.Equal(t, 1, inserted)
	require.Equal(t, 9, absorbed)
	require.Equal(t, 9, conflicts)
	require.Equal(t, 9, queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox_conflicts c JOIN pgrelay.inbox i
		ON i.handler = c.handler AND i.dedup_key = c.dedup_key AND i.event_id = c.stored_event_id AND i.fingerprint = c.stored_fingerprint
		WHERE c.dedup_key = 'pay:o2'`))
}

// TestUnbuildableKeyGoesDead: a payload lacking the strategy's field is
// stored dead with the reason under the reserved key, never keyed by
// something else; its redelivery is absorbed.
func TestUnbuildableKeyGoesDead(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	targets := []pgrelay.Target{{Handler: "h", DedupKey: "business:pay:{order_id}"}}
	bad := pgrelay.Incoming{Message: pgrelay.Message{EventID: "nokey", EventType: "PaymentRequested", Payload: []byte(`{"amount_cents":1}`)}}
	res := receiveFor(t, pool, targets, bad, payment("fine", "o1", 1))
	require.Equal(t, 2, res.Inserted)
	require.Len(t, res.KeyFailures, 1)
	var status, reason, key string
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT status, last_error, dedup_key FROM pgrelay.inbox WHERE event_id = 'nokey'`).Scan(&status, &reason, &key))
	require.Equal(t, "dead", status)
	require.Equal(t, "dedup key (business:pay:{order_id}): payload lacks field order_id", reason)
	require.Equal(t, "!nokey", key)
	res = receiveFor(t, pool, targets, bad)
	require.Equal(t, []string{"nokey"}, res.Duplicates)
}

// TestFencingIsPerHandler: a handler's claim and marks touch only its own
// rows: a worker of one handler never claims, marks or hands back another's,
// even for the same event and dedup key.
func TestFencingIsPerHandler(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	effectsTable(t, pool)
	targets := []pgrelay.Target{{Handler: "a"}, {Handler: "b"}}
	receiveFor(t, pool, targets, payment("e1", "o1", 1))
	cfg := fastConfig(t, pool, effectHandler("a", nil))
	cfg.HandlerName = "a"
	stop := startWorker(t, cfg)
	require.Eventually(t, func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox WHERE handler = 'a' AND status = 'processed'`) == 1
	}, 10*time.Second, 10*time.Millisecond)
	stop()
	require.Equal(t, 1, queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox WHERE handler = 'b' AND status = 'pending' AND attempts = 0 AND lock_version = 0`),
		"handler b's row is untouched")
}

// TestStrategyPerTopic: a target's per-topic strategy keys that topic's
// messages; the others keep the target's own.
func TestStrategyPerTopic(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	targets := []pgrelay.Target{{Handler: "h", DedupKeyByTopic: map[string]string{
		"payments": "business:payment:{order_id}"}}}
	other := payment("o-1", "o1", 1)
	other.Topic = "orders"
	other2 := payment("o-2", "o1", 1)
	other2.Topic = "orders"
	res := receiveFor(t, pool, targets, payment("p-1", "o1", 1), payment("p-2", "o1", 1), other, other2)
	require.Equal(t, 3, res.Inserted, "payments keyed by order (1), orders by id (2)")
	require.Equal(t, 1, queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox WHERE topic = 'payments' AND dedup_key = 'payment:o1'
		AND key_strategy = 'business:payment:{order_id}'`))
	require.Equal(t, 2, queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox WHERE topic = 'orders' AND key_strategy = 'message-id'`))
}
