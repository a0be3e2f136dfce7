package consumer

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	pgnats "github.com/pgrelay/pgrelay/broker/nats"
	"github.com/pgrelay/pgrelay/internal/event"
)

// publishSeq sends one event of key with sequence seq (raw: the header as
// given) the way the relay does; msgID is the broker's dedup id.
func (b *testBundle) publishSeq(t *testing.T, id, msgID, key, seq string) {
	t.Helper()
	b.publishSeqPayload(t, id, msgID, key, seq, `{}`)
}

// publishSeqPayload is publishSeq with a payload.
func (b *testBundle) publishSeqPayload(t *testing.T, id, msgID, key, seq, payload string) {
	t.Helper()
	m := nats.NewMsg(b.prefix + ".orders")
	m.Data = []byte(payload)
	m.Header.Set(pgnats.MsgIDHeader, msgID)
	m.Header.Set(event.HeaderEventID, id)
	m.Header.Set(event.HeaderEventType, "Step")
	m.Header.Set(event.HeaderTopic, "orders")
	m.Header.Set(event.HeaderKey, key)
	m.Header.Set(event.HeaderKeySeq, seq)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := b.js.PublishMsg(ctx, m)
	require.NoError(t, err)
}

// TestOrderedThroughTheBroker: one key's events published to the broker in
// reverse, one delivered twice, one as another event reusing a sequence, one
// missing and one with a malformed sequence: the consumer applies the key in
// sequence exactly once up to the gap, stores the malformed one dead, holds
// the rest, and drains once the missing event arrives.
func TestOrderedThroughTheBroker(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, `CREATE TABLE applied (n bigserial PRIMARY KEY, key text, seq bigint)`)
	require.NoError(t, err)
	cfg := b.config()
	cfg.Inbox.Ordered = true
	cfg.Inbox.Handler = pgrelay.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
		_, err := tx.Exec(ctx, `INSERT INTO applied (key, seq) VALUES ($1, $2)`, ev.Key, ev.KeySeq)
		return err
	})
	c, err := newConsumer(cfg)
	require.NoError(t, err)
	b.start(t, c)

	for _, s := range []string{"5", "3", "2", "1"} {
		b.publishSeq(t, "e-"+s, "e-"+s, "k", s)
	}
	b.publishSeq(t, "e-3", "e-3-redelivered", "k", "3") // passes the broker's dedup; the inbox absorbs it
	b.publishSeq(t, "e-2-again", "e-2-again", "k", "2") // another event with an applied sequence
	b.publishSeq(t, "bad", "bad", "k", "two")

	applied := func() []int64 {
		rows, err := b.pool.Query(ctx, `SELECT seq FROM applied WHERE key = 'k' ORDER BY n`)
		require.NoError(t, err)
		out, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		require.NoError(t, err)
		return out
	}
	status := func(id string) (st, lastErr string) {
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT status, coalesce(last_error, '') FROM pgrelay.inbox WHERE event_id = $1`, id).
			Scan(&st, &lastErr))
		return st, lastErr
	}
	require.Eventually(t, func() bool { return len(applied()) == 3 }, 20*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool { st, _ := status("e-2-again"); return st == "processed" }, 10*time.Second, 20*time.Millisecond)
	st, why := status("bad")
	require.Equal(t, "dead", st)
	require.Contains(t, why, broker.ReasonInvalidKeySeq)
	require.Eventually(t, func() bool { st, _ := status("e-5"); return st == "pending" }, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, []int64{1, 2, 3}, applied())

	b.publishSeq(t, "e-4", "e-4", "k", strconv.Itoa(4))
	require.Eventually(t, func() bool { return len(applied()) == 5 }, 20*time.Second, 20*time.Millisecond)
	require.Equal(t, []int64{1, 2, 3, 4, 5}, applied())
}

// TestOrderedWithContentHashThroughTheBroker: an ordered handler keyed by
// content hash. A double click (two events of order-1 with one payload,
// sequences 1 and 2) stores one row; the second's sequence counts as
// delivered, so sequence 3 applies instead of waiting for it for ever.
func TestOrderedWithContentHashThroughTheBroker(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, `CREATE TABLE applied (n bigserial PRIMARY KEY, key text, seq bigint)`)
	require.NoError(t, err)
	cfg := b.config()
	cfg.Inbox.Ordered = true
	cfg.Targets = []pgrelay.Target{{Handler: cfg.Inbox.HandlerName, DedupKey: "content-hash"}}
	cfg.Inbox.Handler = pgrelay.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
		_, err := tx.Exec(ctx, `INSERT INTO applied (key, seq) VALUES ($1, $2)`, ev.Key, ev.KeySeq)
		return err
	})
	c, err := newConsumer(cfg)
	require.NoError(t, err)
	b.start(t, c)

	b.publishSeqPayload(t, "click-1", "click-1", "order-1", "1", `{"pay":100}`)
	b.publishSeqPayload(t, "click-2", "click-2", "order-1", "2", `{"pay":100}`)
	b.publishSeqPayload(t, "refund", "refund", "order-1", "3", `{"refund":100}`)
	applied := func() []int64 {
		rows, err := b.pool.Query(ctx, `SELECT seq FROM applied ORDER BY n`)
		require.NoError(t, err)
		out, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		require.NoError(t, err)
		return out
	}
	require.Eventually(t, func() bool { return len(applied()) == 2 }, 20*time.Second, 20*time.Millisecond,
		"sequence 3 waits for the absorbed sequence 2")
	require.Equal(t, []int64{1, 3}, applied())
	var last int64
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT last_applied FROM pgrelay.inbox_key_state WHERE key = 'order-1'`).Scan(&last))
	require.EqualValues(t, 3, last)
}
