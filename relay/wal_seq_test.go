package relay

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	pgnats "github.com/pgrelay/pgrelay/broker/nats"
	"github.com/pgrelay/pgrelay/consumer"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/logtest"
)

// seqOf returns m's Pgrelay-Key-Seq header as a number (0: none).
func seqOf(t *testing.T, m received) int64 {
	t.Helper()
	v := hdr(m, event.HeaderKeySeq)
	if v == "" {
		return 0
	}
	n, err := strconv.ParseInt(v, 10, 64)
	require.NoError(t, err)
	return n
}

// recorded returns the WAL capture's recorded numbers: event id → sequence.
func (b *bundle) recorded(t *testing.T) map[string]int64 {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), `SELECT event_id, seq FROM pgrelay.wal_seq_assignments`)
	require.NoError(t, err)
	out := map[string]int64{}
	for rows.Next() {
		var id string
		var seq int64
		require.NoError(t, rows.Scan(&id, &seq))
		out[id] = seq
	}
	require.NoError(t, rows.Err())
	return out
}

// TestWALKeySeqsInCommitOrder: the WAL capture numbers each explicit key's
// events 1, 2, 3, ... in commit order across transactions, publishes them as
// Pgrelay-Key-Seq, gives none to an event without a key (or keyed by its
// own id), and continues a key the table capture numbered before.
func TestWALKeySeqsInCommitOrder(t *testing.T) {
	b, _ := walSetup(t, walConf)
	ch := b.subscribe(t)
	// The table capture numbered key t up to 3 (no table relay runs here).
	b.enqueue(t, msgs(3, "t", "table")...)
	r, _ := start(t, b.walConfig(t, b.publisher(t), nil))
	waitReading(t, r)

	ev := func(id, key string) pgrelay.Message {
		return pgrelay.Message{EventID: id, Topic: "orders", Key: key, Payload: []byte(id)}
	}
	b.emit(t, ev("a1", "a"), ev("b1", "b"), ev("a2", "a"), ev("none", ""))
	b.emit(t, ev("own", "own"), ev("b2", "b"), ev("t4", "t"))
	b.emit(t, ev("a3", "a"), ev("t5", "t"), ev("b3", "b"))

	want := map[string]int64{"a1": 1, "b1": 1, "a2": 2, "none": 0, "own": 0, "b2": 2, "t4": 4, "a3": 3, "t5": 5, "b3": 3}
	got := readAll(t, ch, len(want), 20*time.Second)
	for _, m := range got {
		require.Equal(t, want[m.eventID], seqOf(t, m), "event %s", m.eventID)
	}
	var a, tt int64
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT (SELECT seq FROM pgrelay.outbox_key_seqs WHERE key = 'a'),
		(SELECT seq FROM pgrelay.outbox_key_seqs WHERE key = 't')`).Scan(&a, &tt))
	require.Equal(t, []int64{3, 5}, []int64{a, tt}, "the keys' counters, shared with the table capture")
}

// TestWALKeySeqsStableAcrossReRead: events numbered by a relay that could
// not publish them (the broker down), read again from the slot by the next
// relay, are published with the numbers they were given, and the key goes
// on after them.
func TestWALKeySeqsStableAcrossReRead(t *testing.T) {
	b, _ := walSetup(t, walConf)
	ch := b.subscribe(t)
	flaky := &flakyPublisher{Publisher: b.publisher(t)}
	flaky.failing.Store(true)
	r, stop := start(t, b.walConfig(t, flaky, nil))
	waitReading(t, r)

	b.emit(t, msgs(6, "k", "a")...)
	b.emit(t, msgs(4, "k", "b")...)
	// The first transaction (at least) is numbered, its publishing retried.
	require.Eventually(t, func() bool { return len(b.recorded(t)) >= 6 && flaky.calls.Load() >= 2 }, 20*time.Second, 20*time.Millisecond)
	first := b.recorded(t)
	stop()

	start(t, b.walConfig(t, b.publisher(t), nil))
	b.emit(t, msgs(2, "k", "c")...)
	got := readAll(t, ch, 12, 30*time.Second)
	for i, m := range got {
		require.Equal(t, int64(i+1), seqOf(t, m), "event %s", m.eventID)
		if n, ok := first[m.eventID]; ok {
			require.Equal(t, n, seqOf(t, m), "event %s was read again with another number", m.eventID)
		}
	}
}

// TestWALNumberingFencedAfterTakeover: a reader paused right before numbering
// a batch (its freshness checked) past wal_sender_timeout is cut off; the
// standby takes over, numbers and publishes the events, and their records
// are pruned once the slot's restart_lsn passed them. The paused relay,
// woken up, numbers nothing: had it numbered its stale read afresh, the
// key's next events would follow a gap.
func TestWALNumberingFencedAfterTakeover(t *testing.T) {
	b, _ := walSetup(t, walConf)
	ch := b.subscribe(t)
	obsA := &countingObserver{}
	var paused atomic.Bool
	releaseReader, releasePublisher := make(chan struct{}), make(chan struct{})
	var onceR, onceP sync.Once
	wake := func(once *sync.Once, ch chan struct{}) { once.Do(func() { close(ch) }) }
	defer wake(&onceR, releaseReader)
	defer wake(&onceP, releasePublisher)
	// As SIGSTOP would: the reader stops too (no status updates), and the
	// publisher right before numbering. The publisher wakes first, so that
	// its numbering runs before the reader notices the silence and ends
	// the session.
	cfgA := b.walConfig(t, b.publisher(t), obsA)
	cfgA.hooks.walBeforeStatus = func() {
		if paused.Load() {
			<-releaseReader
		}
	}
	cfgA.hooks.walBeforeNumber = func() {
		if paused.Load() {
			<-releasePublisher
		}
	}
	ra, _ := start(t, cfgA)
	waitReading(t, ra)
	_, _ = start(t, b.walConfig(t, b.publisher(t), nil))

	paused.Store(true)
	b.emit(t, msgs(10, "k", "a")...)
	got := readAll(t, ch, 10, 30*time.Second) // by the standby, once A was cut
	require.Equal(t, int64(10), seqOf(t, got[9]))
	ctx := context.Background()
	require.Eventually(t, func() bool {
		_, err := b.pool.Exec(ctx, `CHECKPOINT`) // logs the running transactions: restart_lsn can move on
		require.NoError(t, err)
		return len(b.recorded(t)) == 0
	}, 30*time.Second, 300*time.Millisecond, "the records behind the slot's restart_lsn are pruned")

	wake(&onceP, releasePublisher)
	time.Sleep(time.Second)
	wake(&onceR, releaseReader)
	time.Sleep(500 * time.Millisecond)
	require.Zero(t, obsA.published.Load(), "the paused relay published what it read before the pause")
	b.emit(t, msgs(5, "k", "b")...)
	got = readAll(t, ch, 5, 20*time.Second)
	for i, m := range got {
		require.Equal(t, int64(11+i), seqOf(t, m), "event %s: the key's numbers went on after a gap", m.eventID)
	}
}

// TestWALDropsExpiredEvents: an event whose ExpiresAt passed before the WAL
// capture would publish it is not published, is counted as expired, and
// takes no sequence; an unexpired one carries its expiry.
func TestWALDropsExpiredEvents(t *testing.T) {
	b, _ := walSetup(t, walConf)
	ch := b.subscribe(t)
	obs := &countingObserver{}
	r, _ := start(t, b.walConfig(t, b.publisher(t), obs))
	waitReading(t, r)

	later := time.Now().Add(time.Hour)
	b.emit(t, pgrelay.Message{EventID: "gone", Topic: "orders", Key: "k", Payload: []byte("x"), ExpiresAt: time.Now().Add(-time.Second)},
		pgrelay.Message{EventID: "e1", Topic: "orders", Key: "k", Payload: []byte("1")})
	b.emit(t, pgrelay.Message{EventID: "e2", Topic: "orders", Key: "k", Payload: []byte("2"), ExpiresAt: later})
	got := readAll(t, ch, 2, 20*time.Second)
	require.Equal(t, []string{"e1", "e2"}, []string{got[0].eventID, got[1].eventID})
	require.Equal(t, []int64{1, 2}, []int64{seqOf(t, got[0]), seqOf(t, got[1])}, "an expired event takes no sequence")
	require.NotEmpty(t, hdr(got[1], event.HeaderExpiresAt))
	require.Equal(t, int64(1), obs.expired.Load())
	require.Equal(t, int64(2), obs.published.Load())
}

// TestWALOrderedApplyEndToEnd: events emitted to the WAL by concurrent
// producers, captured by a relay replaced midway (the next one reads again
// what the first had not confirmed), reach an ordered inbox handler that
// applies each key's events exactly once, in commit order, with contiguous
// sequences.
func TestWALOrderedApplyEndToEnd(t *testing.T) {
	b, _ := walSetup(t, walConf)
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, `CREATE TABLE applied (n bigserial PRIMARY KEY, key text, seq bigint, event_id text);
		CREATE TABLE emitted (n bigserial PRIMARY KEY, key text, event_id text)`)
	require.NoError(t, err)

	c, err := consumer.New(consumer.Config{
		Pool: b.pool,
		Subscribe: func(ctx context.Context) (broker.Subscriber, error) {
			return pgnats.NewSubscriber(ctx, pgnats.Config{URL: b.natsURL, Stream: b.stream, SubjectPrefix: b.prefix, Durable: "ordered",
				AckWait: 10 * time.Second, MaxAckPending: 200, MaxPayloadBytes: 1 << 20})
		},
		FetchBatchSize: 20, MaxWait: 100 * time.Millisecond, RetryMin: 10 * time.Millisecond, RetryMax: 200 * time.Millisecond, StatsInterval: -1,
		Inbox: pgrelay.InboxConfig{
			Ordered: true,
			Handler: pgrelay.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
				_, err := tx.Exec(ctx, `INSERT INTO applied (key, seq, event_id) VALUES ($1, $2, $3)`, ev.Key, ev.KeySeq, ev.EventID)
				return err
			}),
			PollInterval: 50 * time.Millisecond, BackoffMin: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
			DeferFallback: 200 * time.Millisecond,
		},
		Logger: logtest.NewAt(t, slog.LevelWarn),
	})
	require.NoError(t, err)
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(cctx) }()
	t.Cleanup(func() { cancel(); <-done })

	r1, stop1 := start(t, b.walConfig(t, b.publisher(t), nil))
	waitReading(t, r1)
	keys := []string{"k1", "k2", "k3"}
	const producers, txs = 4, 15
	produce := func(round int) {
		var wg sync.WaitGroup
		for p := range producers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range txs {
					var ms []pgrelay.Message
					for j, k := range keys[:1+(p+i)%len(keys)] {
						ms = append(ms, pgrelay.Message{EventID: fmt.Sprintf("r%d-p%d-%d-%d", round, p, i, j), Topic: "orders", Key: k, EventType: "Step", Payload: []byte("{}")})
					}
					// The commit order of a key's events is the order of
					// their rows in emitted: the key's row lock orders them.
					err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
						for _, m := range ms {
							if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, m.Key); err != nil {
								return err
							}
						}
						for _, m := range ms {
							if _, err := tx.Exec(ctx, `INSERT INTO emitted (key, event_id) VALUES ($1, $2)`, m.Key, m.EventID); err != nil {
								return err
							}
						}
						o, _ := newOutboxForTest()
						return o.Emit(ctx, tx, ms...)
					})
					if err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
	}
	produce(1)
	stop1() // the next relay reads again from what the first confirmed
	start(t, b.walConfig(t, b.publisher(t), nil))
	produce(2)

	var total int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM emitted`).Scan(&total))
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM applied`).Scan(&n))
		return n >= total
	}, 60*time.Second, 100*time.Millisecond)
	time.Sleep(500 * time.Millisecond)
	for _, k := range keys {
		var want, got []string
		var seqs []int64
		rows, err := b.pool.Query(ctx, `SELECT event_id FROM emitted WHERE key = $1 ORDER BY n`, k)
		require.NoError(t, err)
		want, err = pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		rows, err = b.pool.Query(ctx, `SELECT event_id, seq FROM applied WHERE key = $1 ORDER BY n`, k)
		require.NoError(t, err)
		for rows.Next() {
			var id string
			var seq int64
			require.NoError(t, rows.Scan(&id, &seq))
			got, seqs = append(got, id), append(seqs, seq)
		}
		require.NoError(t, rows.Err())
		require.Equal(t, want, got, "key %s: applied once each, in commit order", k)
		for i, s := range seqs {
			require.Equal(t, int64(i+1), s, "key %s", k)
		}
	}
}
