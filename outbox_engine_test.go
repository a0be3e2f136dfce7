package pgrelay_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

func enqueue(t *testing.T, pool *pgxpool.Pool, o *pgrelay.Outbox, msgs ...pgrelay.Message) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return o.Enqueue(ctx, tx, msgs...) })
}

type outboxRow struct {
	ID        int64
	EventID   string
	Topic     string
	Key       string
	EventType string
	Payload   []byte
	Headers   map[string]string
	Status    string
	Partition int32
}

func rows(t *testing.T, pool *pgxpool.Pool) []outboxRow {
	t.Helper()
	rs, err := pool.Query(context.Background(), `SELECT id, event_id, topic, key, event_type, payload, headers, status, partition FROM pgrelay.outbox ORDER BY id`)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rs, func(r pgx.CollectableRow) (outboxRow, error) {
		var x outboxRow
		var h []byte
		err := r.Scan(&x.ID, &x.EventID, &x.Topic, &x.Key, &x.EventType, &x.Payload, &h, &x.Status, &x.Partition)
		if err == nil {
			err = json.Unmarshal(h, &x.Headers)
		}
		return x, err
	})
	require.NoError(t, err)
	return out
}

func TestEnqueueDefaultsAndOrder(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	o, err := pgrelay.NewOutbox(pgrelay.OutboxConfig{})
	require.NoError(t, err)

	require.NoError(t, enqueue(t, pool, o,
		pgrelay.Message{Topic: "orders", Key: "order-1", EventType: "OrderCreated", Payload: []byte(`{"n":1}`), Headers: map[string]string{"trace-id": "abc"}},
		pgrelay.Message{EventID: "evt-2", Topic: "orders", Key: "order-1", EventType: "OrderPaid", Payload: []byte(`{"n":2}`)},
		pgrelay.Message{Topic: "orders.audit"},
	))
	got := rows(t, pool)
	require.Len(t, got, 3)
	require.Len(t, got[0].EventID, 36, "a UUIDv7 is generated")
	require.Equal(t, byte('7'), got[0].EventID[14], "version 7")
	require.Equal(t, "evt-2", got[1].EventID)
	require.Less(t, got[0].ID, got[1].ID, "ids follow slice order")
	require.Equal(t, "abc", got[0].Headers["trace-id"])
	require.Equal(t, got[2].EventID, got[2].Key, "an empty key defaults to the event id")
	require.Equal(t, got[0].Partition, got[1].Partition, "one key, one partition")
	for _, r := range got {
		require.Equal(t, "pending", r.Status)
	}
}

func TestEnqueueRollbackWritesNothing(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	o, err := pgrelay.NewOutbox(pgrelay.OutboxConfig{})
	require.NoError(t, err)
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, o.Enqueue(ctx, tx, pgrelay.Message{Topic: "orders", Key: "k"}))
	require.NoError(t, tx.Rollback(ctx))
	require.Empty(t, rows(t, pool))
}

func TestEnqueueValidation(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	o, err := pgrelay.NewOutbox(pgrelay.OutboxConfig{MaxPayloadBytes: 10})
	require.NoError(t, err)
	ok := pgrelay.Message{Topic: "orders"}
	cases := []struct {
		name string
		msg  pgrelay.Message
		want string
	}{
		{"missing topic", pgrelay.Message{}, "message 1: topic is required"},
		{"bad topic", pgrelay.Message{Topic: "orders.*"}, `topic "orders.*" is invalid`},
		{"empty topic part", pgrelay.Message{Topic: "orders..x"}, "is invalid"},
		{"control chars in event id", pgrelay.Message{Topic: "t", EventID: "a\nb"}, "event_id is invalid"},
		{"long event id", pgrelay.Message{Topic: "t", EventID: strings.Repeat("x", 256)}, "longer than 255"},
		{"payload over limit", pgrelay.Message{Topic: "t", Payload: make([]byte, 11)}, "payload too large: 11 bytes, the limit is 10"},
		{"header name", pgrelay.Message{Topic: "t", Headers: map[string]string{"a b": "x"}}, "header is invalid"},
		{"header value", pgrelay.Message{Topic: "t", Headers: map[string]string{"a": "x\r\ny"}}, "line break"},
		{"NUL in the key", pgrelay.Message{Topic: "t", Key: "k\x00y"}, "key contains a NUL character"},
		{"invalid UTF-8 key", pgrelay.Message{Topic: "t", Key: "k\xffy"}, "key is not valid UTF-8"},
		{"long key", pgrelay.Message{Topic: "t", Key: strings.Repeat("k", event.MaxKeyLen+1)}, "key too long: 1025 bytes, the limit is 1024"},
		{"NUL in the event type", pgrelay.Message{Topic: "t", EventType: "Order\x00Paid"}, "event type contains a NUL character"},
		{"NUL in a header value", pgrelay.Message{Topic: "t", Headers: map[string]string{"a": "x\x00y"}}, `header is invalid: value of "a" contains a NUL character`},
	}
	for _, c := range cases {
		err := enqueue(t, pool, o, ok, c.msg)
		require.ErrorContains(t, err, c.want, c.name)
	}
	require.Empty(t, rows(t, pool), "a rejected batch writes nothing, not even its valid messages")

	_, err = pgrelay.NewOutbox(pgrelay.OutboxConfig{MaxPayloadBytes: -1})
	require.ErrorContains(t, err, "MaxPayloadBytes")

	// A key at the limit is fine.
	require.NoError(t, enqueue(t, pool, o, pgrelay.Message{Topic: "t", Key: strings.Repeat("k", event.MaxKeyLen)}))
}

func TestEnqueueDuplicateEventID(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	o, err := pgrelay.NewOutbox(pgrelay.OutboxConfig{})
	require.NoError(t, err)
	require.NoError(t, enqueue(t, pool, o, pgrelay.Message{EventID: "same", Topic: "t"}))
	err = enqueue(t, pool, o, pgrelay.Message{EventID: "same", Topic: "t"})
	require.ErrorIs(t, err, pgrelay.ErrDuplicateEvent)
	require.Len(t, rows(t, pool), 1)
}

// TestPlainSQLContract is the contract for producers in any language: four
// columns are enough, the defaults and the trigger fill in the rest.
func TestPlainSQLContract(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO pgrelay.outbox (topic, key, event_type, payload) VALUES ('orders', 'order-9', 'OrderCreated', '{"id":9}')`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO pgrelay.outbox (topic, key, event_type, payload, event_id, headers, occurred_at)
		VALUES ('orders', 'order-9', 'OrderPaid', '{"id":9}', 'evt-paid-9', '{"trace":"t1"}', '2026-01-02T03:04:05Z')`)
	require.NoError(t, err)
	// Someone trying to force an id or a status gets the trigger's instead.
	_, err = pool.Exec(ctx, `INSERT INTO pgrelay.outbox (id, topic, status) VALUES (1000000, 'orders', 'published')`)
	require.NoError(t, err)

	got := rows(t, pool)
	require.Len(t, got, 3)
	require.Regexp(t, `^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`, got[0].EventID)
	require.Equal(t, "evt-paid-9", got[1].EventID)
	require.Equal(t, "t1", got[1].Headers["trace"])
	require.Equal(t, got[0].Partition, got[1].Partition)
	require.Less(t, got[2].ID, int64(1000000))
	require.Equal(t, "pending", got[2].Status)
	var p int32
	require.NoError(t, pool.QueryRow(ctx, `SELECT pgrelay.outbox_partition('order-9')`).Scan(&p))
	require.Equal(t, p, got[0].Partition)
	// The partition is the trigger's too (00090 made it a plain column):
	// a forced value is replaced, and a changed key moves the row.
	_, err = pool.Exec(ctx, `INSERT INTO pgrelay.outbox (event_id, topic, key, partition) VALUES ('forced', 'orders', 'order-9', $1)`, (p+1)%16)
	require.NoError(t, err)
	var forced int32
	require.NoError(t, pool.QueryRow(ctx, `SELECT partition FROM pgrelay.outbox WHERE event_id = 'forced'`).Scan(&forced))
	require.Equal(t, p, forced)
	var moved, want int32
	require.NoError(t, pool.QueryRow(ctx, `UPDATE pgrelay.outbox SET key = 'order-10' WHERE event_id = 'forced' RETURNING partition`).Scan(&moved))
	require.NoError(t, pool.QueryRow(ctx, `SELECT pgrelay.outbox_partition('order-10')`).Scan(&want))
	require.Equal(t, want, moved)
	require.NoError(t, pool.QueryRow(ctx, `UPDATE pgrelay.outbox SET partition = partition + 1 WHERE event_id = 'forced' RETURNING partition`).Scan(&moved))
	require.Equal(t, want, moved)
	var mismatched int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pgrelay.outbox WHERE partition <> pgrelay.outbox_partition(key)`).Scan(&mismatched))
	require.Zero(t, mismatched)
}

// TestSameKeyWritersGetIDsInCommitOrder proves the enqueue lock: a second
// writer of a key blocks until the first commits, so it gets the larger id
// even though it started inserting while the first was still open.
func TestSameKeyWritersGetIDsInCommitOrder(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	o, err := pgrelay.NewOutbox(pgrelay.OutboxConfig{})
	require.NoError(t, err)

	tx1, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx1.Rollback(ctx) //nolint:errcheck
	require.NoError(t, o.Enqueue(ctx, tx1, pgrelay.Message{EventID: "first", Topic: "t", Key: "k"}))

	done := make(chan error, 1)
	go func() { done <- enqueue(t, pool, o, pgrelay.Message{EventID: "second", Topic: "t", Key: "k"}) }()
	// Wait until the second writer is blocked on the key's lock in this
	// database, or (without the lock) has already committed.
	waiting := func() bool {
		var w bool
		_ = pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_database d ON d.oid = l.database
			WHERE d.datname = current_database() AND l.locktype = 'advisory' AND NOT l.granted)`).Scan(&w)
		return w
	}
	require.Eventually(t, func() bool { return waiting() || len(done) > 0 }, 10*time.Second, 5*time.Millisecond)
	require.Empty(t, done, "the second writer of a key must wait for the first to commit")
	// An unrelated key is not blocked.
	require.NoError(t, enqueue(t, pool, o, pgrelay.Message{EventID: "other", Topic: "t", Key: "other-key"}))
	require.NoError(t, tx1.Commit(ctx))
	require.NoError(t, <-done)

	got := rows(t, pool)
	ids := map[string]int64{}
	for _, r := range got {
		ids[r.EventID] = r.ID
	}
	require.Less(t, ids["first"], ids["second"], "the later commit has the larger id")
}

// TestConcurrentBatchesDoNotDeadlock enqueues the same keys in opposite
// orders from concurrent transactions.
func TestConcurrentBatchesDoNotDeadlock(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	o, err := pgrelay.NewOutbox(pgrelay.OutboxConfig{})
	require.NoError(t, err)
	keys := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	errs := make(chan error, 20)
	for i := range 20 {
		go func() {
			msgs := make([]pgrelay.Message, len(keys))
			for j, k := range keys {
				if i%2 == 1 {
					k = keys[len(keys)-1-j]
				}
				msgs[j] = pgrelay.Message{Topic: "t", Key: k}
			}
			errs <- enqueue(t, pool, o, msgs...)
		}()
	}
	for range 20 {
		require.NoError(t, <-errs)
	}
	require.Len(t, rows(t, pool), 20*len(keys))
}

// TestOccurredAtEdges: Enqueue refuses an occurred_at outside the range (after
// 0001-01-01T00:00:00Z, at most 9999-12-31T23:59:59.999999Z once rounded to the
// microsecond), naming the field; what it accepts is stored exactly as
// rounded; and plain SQL is held to the same range by a constraint.
func TestOccurredAtEdges(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	o, err := pgrelay.NewOutbox(pgrelay.OutboxConfig{})
	require.NoError(t, err)
	utc := func(y int, mo time.Month, d, h, mi, s, ns int) time.Time {
		return time.Date(y, mo, d, h, mi, s, ns, time.UTC)
	}

	for _, bad := range []time.Time{
		utc(9999, 12, 31, 23, 59, 59, 999999999), // PostgreSQL would round it to year 10000
		utc(10000, 1, 1, 0, 0, 0, 0),
		utc(1, 1, 1, 0, 0, 0, 400), // rounds to 0001-01-01T00:00:00Z
		utc(0, 6, 1, 0, 0, 0, 0),
	} {
		err := enqueue(t, pool, o, pgrelay.Message{Topic: "t"}, pgrelay.Message{Topic: "t", OccurredAt: bad})
		require.ErrorIs(t, err, event.ErrOccurredAtOutOfRange, "%s", bad)
		require.ErrorContains(t, err, "message 1: occurred_at is out of range", "%s", bad)
	}
	require.Empty(t, rows(t, pool))

	stored := func(id string) time.Time {
		var at time.Time
		require.NoError(t, pool.QueryRow(ctx, `SELECT occurred_at FROM pgrelay.outbox WHERE event_id = $1`, id).Scan(&at))
		return at.UTC()
	}
	edges := map[string]struct{ in, want time.Time }{
		"max":     {utc(9999, 12, 31, 23, 59, 59, 999999000), utc(9999, 12, 31, 23, 59, 59, 999999000)},
		"max-ns":  {utc(9999, 12, 31, 23, 59, 59, 999999400), utc(9999, 12, 31, 23, 59, 59, 999999000)},
		"min":     {utc(1, 1, 1, 0, 0, 0, 1000), utc(1, 1, 1, 0, 0, 0, 1000)},
		"rounded": {utc(2026, 1, 2, 3, 4, 5, 123456789), utc(2026, 1, 2, 3, 4, 5, 123457000)},
	}
	for id, e := range edges {
		require.NoError(t, enqueue(t, pool, o, pgrelay.Message{EventID: id, Topic: "t", OccurredAt: e.in}), id)
		require.Equal(t, e.want, stored(id), id)
	}

	// Plain SQL: the same range, as a constraint.
	for _, lit := range []string{"0001-01-01 00:00:00+00", "10000-01-01 00:00:00+00", "9999-12-31 23:59:59.9999995+00", "0001-01-01 00:00:00+00 BC"} {
		_, err := pool.Exec(ctx, `INSERT INTO pgrelay.outbox (topic, occurred_at) VALUES ('t', $1::text::timestamptz)`, lit)
		require.ErrorContains(t, err, "outbox_occurred_at_range", lit)
	}
	for _, lit := range []string{"0001-01-01 00:00:00.000001+00", "9999-12-31 23:59:59.999999+00"} {
		_, err := pool.Exec(ctx, `INSERT INTO pgrelay.outbox (topic, occurred_at) VALUES ('t', $1::text::timestamptz)`, lit)
		require.NoError(t, err, lit)
	}
}

// TestPlainSQLKeyLength: a plain-SQL producer gets the key limit Enqueue
// applies (event.MaxKeyLen bytes), refused at its insert by a constraint
// naming it.
func TestPlainSQLKeyLength(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO pgrelay.outbox (topic, key) VALUES ('orders', $1)`, strings.Repeat("é", event.MaxKeyLen/2))
	require.NoError(t, err, "a key of exactly the limit in bytes")
	_, err = pool.Exec(ctx, `INSERT INTO pgrelay.outbox (topic, key) VALUES ('orders', $1)`, strings.Repeat("é", event.MaxKeyLen/2)+"k")
	require.ErrorContains(t, err, "outbox_key_length")
}
