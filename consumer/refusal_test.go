package consumer

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/internal/logtest"
)

// ackedDeliveries wraps msgs as deliveries whose acknowledgements are
// recorded.
type ackedDeliveries struct {
	mu    sync.Mutex
	acked []string
}

func (a *ackedDeliveries) deliveries(msgs ...pgrelay.Message) []broker.Delivery {
	ds := make([]broker.Delivery, len(msgs))
	for i, m := range msgs {
		id := m.EventID
		ds[i] = broker.Delivery{Message: m, Ref: "test/" + id,
			Ack: func(context.Context) error {
				a.mu.Lock()
				defer a.mu.Unlock()
				a.acked = append(a.acked, id)
				return nil
			},
			InProgress: func(context.Context) error { return nil }}
	}
	return ds
}

func (a *ackedDeliveries) ids() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.acked...)
}

func keyed(id, key string, seq int64) pgrelay.Message {
	return pgrelay.Message{EventID: id, Topic: "orders", Key: key, KeySeq: seq, EventType: "Step",
		Payload: []byte(`{}`), OccurredAt: time.Now()}
}

// TestOversizedKeyGoesDeadAndTheBatchGoesThrough: a delivery with a key of a
// few KB and a key sequence (a producer publishing straight to the broker,
// past the decoder's bound) would make the inbox's key-sequence index refuse
// the row. It goes dead with the reason; the good messages fetched with it
// are stored and acknowledged, and so is it. Before, the refusal (SQLSTATE
// 54000) was taken for an outage and the whole batch retried for ever.
func TestOversizedKeyGoesDeadAndTheBatchGoesThrough(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.cfg.disableWorkers = true
	c, err := newConsumer(b.config())
	require.NoError(t, err)
	long := incompressible(3000)
	var a ackedDeliveries
	ds := a.deliveries(keyed("good-1", "k", 1), keyed("long", long, 1), keyed("good-2", "k", 2))
	// Bounded: the old code retried until the consumer stopped.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c.handle(ctx, ds)

	require.ElementsMatch(t, []string{"good-1", "long", "good-2"}, a.ids(), "every delivery acknowledged")
	var status, reason, key, raw string
	var seq *int64
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT status, coalesce(last_error, ''), key, key_seq, coalesce(headers->>$1, '')
		FROM pgrelay.inbox WHERE event_id = 'long'`, broker.RawKeyHeader).Scan(&status, &reason, &key, &seq, &raw))
	require.Equal(t, "dead", status)
	require.Contains(t, reason, "key too long: 3000 bytes, the limit is 1024")
	require.Empty(t, key)
	require.Nil(t, seq)
	require.Equal(t, long[:256], raw)
	require.Equal(t, 2, count(t, b, `SELECT count(*) FROM pgrelay.inbox WHERE event_id IN ('good-1', 'good-2') AND status = 'pending'`))
}

// TestProgramLimitIsARefusal: the database's own refusal of an oversized key
// (the btree's "index row size exceeds maximum", class 54) counts as a refusal
// of the data, not as an outage to retry.
func TestProgramLimitIsARefusal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Random text does not compress below the btree's limit.
	_, err := b.pool.Exec(ctx, `INSERT INTO pgrelay.inbox (event_id, topic, key, event_type, payload, key_seq)
		SELECT 'e', 't', string_agg(md5(i::text), ''), 'T', ''::bytea, 1 FROM generate_series(1, 200) i`)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%v", err)
	require.Equal(t, "54000", pgErr.Code, pgErr.Message)
	require.True(t, isRefused(err))
	require.False(t, isRefused(&pgconn.PgError{Code: "57P01"}), "an admin shutdown is an outage")
	require.False(t, isRefused(&pgconn.PgError{Code: "53300"}), "too many connections is an outage")
}

// TestDeadAtIngestKeepsItsKeySequence: a sequenced message the database
// refuses is stored dead with its key sequence, so that in ordered mode it
// parks its key (listed as parked, not as a gap) and an operator can skip it
// with dead skip; the key then resumes.
func TestDeadAtIngestKeepsItsKeySequence(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.cfg.disableWorkers = true
	c, err := newConsumer(b.config())
	require.NoError(t, err)
	bad := keyed("s-2", "s", 2)
	bad.EventType = "Step\x00" // refused by Receive: stored dead, the text cleaned
	var a ackedDeliveries
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c.handle(ctx, a.deliveries(keyed("s-1", "s", 1), bad, keyed("s-3", "s", 3)))
	require.Len(t, a.ids(), 3)
	var seq *int64
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT key_seq FROM pgrelay.inbox WHERE event_id = 's-2' AND status = 'dead'`).Scan(&seq))
	require.NotNil(t, seq, "the dead copy lost its key sequence")
	require.EqualValues(t, 2, *seq)

	_, err = b.pool.Exec(ctx, `CREATE TABLE applied (n bigserial PRIMARY KEY, event_id text NOT NULL)`)
	require.NoError(t, err)
	wcfg := b.cfg.Inbox
	wcfg.Pool, wcfg.Logger, wcfg.Ordered = b.pool, logtest.New(t), true
	wcfg.Handler = pgrelay.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
		_, err := tx.Exec(ctx, `INSERT INTO applied (event_id) VALUES ($1)`, ev.EventID)
		return err
	})
	w, err := pgrelay.NewInboxWorker(wcfg)
	require.NoError(t, err)
	wctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	t.Cleanup(func() { stop(); <-done })

	applied := func() []string {
		rows, err := b.pool.Query(ctx, `SELECT event_id FROM applied ORDER BY n`)
		require.NoError(t, err)
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return out
	}
	var parked pgrelay.WaitingKey
	require.Eventually(t, func() bool {
		ks, err := pgrelay.ListWaiting(ctx, b.pool, pgrelay.DefaultHandlerName, 10)
		require.NoError(t, err)
		for _, k := range ks {
			if k.Key == "s" && k.Held == 1 && k.WaitingFor == 2 {
				parked = k
				return true
			}
		}
		return false
	}, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, "parked", parked.State, "the dead event must park its key, not show as a gap")
	require.Equal(t, []string{"s-1"}, applied())

	res, err := pgrelay.SkipDead(ctx, b.pool, pgrelay.Skip{Handler: pgrelay.DefaultHandlerName, Actor: "test", Reason: "refused at ingest"}, "s-2")
	require.NoError(t, err)
	require.EqualValues(t, 2, res.From)
	require.Eventually(t, func() bool { return len(applied()) == 2 }, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, []string{"s-1", "s-3"}, applied())
}

// incompressible returns n bytes of hex that PostgreSQL cannot compress
// under the btree's limit.
func incompressible(n int) string {
	var b strings.Builder
	sum := sha256.Sum256([]byte("seed"))
	for b.Len() < n {
		b.WriteString(hex.EncodeToString(sum[:]))
		sum = sha256.Sum256(sum[:])
	}
	return b.String()[:n]
}

func count(t *testing.T, b *testBundle, sql string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), sql).Scan(&n))
	return n
}

// TestRefusedEvenDeadIsCountedAndLogged: a message the database refuses even
// as a dead letter is left unacknowledged (the broker delivers it again);
// while the consumer runs that is counted (Stats().Unacked, the
// consumer_unacked_total metric) and logged with its broker position, and the
// rest of the batch is stored and acknowledged.
func TestRefusedEvenDeadIsCountedAndLogged(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := b.pool.Exec(ctx, `
		CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.event_id = 'poison' THEN
				RAISE EXCEPTION 'refused by a check' USING ERRCODE = 'check_violation';
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER refuse_poison BEFORE INSERT ON pgrelay.inbox FOR EACH ROW EXECUTE FUNCTION refuse_poison();`)
	require.NoError(t, err)
	core, logs := logtest.Observe(slog.LevelError)
	b.cfg.disableWorkers, b.cfg.Logger = true, core
	c, err := newConsumer(b.config())
	require.NoError(t, err)
	var a ackedDeliveries
	c.handle(ctx, a.deliveries(keyed("ok-1", "k", 1), keyed("poison", "k", 2), keyed("ok-3", "k", 3)))

	require.ElementsMatch(t, []string{"ok-1", "ok-3"}, a.ids())
	require.EqualValues(t, 1, c.Stats().Unacked)
	entries := logs.FilterMessageSnippet("left unacknowledged").All()
	require.Len(t, entries, 1)
	require.Equal(t, "test/poison", entries[0].ContextMap()["ref"])
	require.Contains(t, entries[0].Message, "Kafka partition's committed offset")
}
