package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/testcluster"
	"github.com/pgrelay/pgrelay/internal/testnats"
)

// walConf is the private cluster's configuration for the WAL tests: logical
// decoding, a bounded slot, and a short wal_sender_timeout so that a paused
// reader is cut within the test.
const walConf = "wal_level = logical\nmax_slot_wal_keep_size = '64MB'\nwal_sender_timeout = '2s'\nmax_replication_slots = 10\nmax_wal_senders = 10"

// walSetup starts a private cluster with conf and returns a bundle on it.
func walSetup(t *testing.T, conf string) (*bundle, *testcluster.Cluster) {
	t.Helper()
	c := testcluster.Start(t, conf)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, c.URL())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	natsURL := testnats.URL(t)
	stream, prefix := testnats.Stream(t, natsURL)
	_, js := testnats.Connect(t, natsURL)
	return &bundle{pool: pool, dbURL: c.URL(), natsURL: natsURL, stream: stream, prefix: prefix, js: js}, c
}

func (b *bundle) walConfig(t *testing.T, pub broker.Publisher, obs relayObserver) Config {
	cfg := b.testConfig(t, pub, obs)
	cfg.Capture = CaptureWAL
	cfg.walStandbyPoll = 100 * time.Millisecond
	return cfg
}

// emit writes msgs with Emit in one transaction.
func (b *bundle) emit(t testing.TB, msgs ...pgrelay.Message) {
	t.Helper()
	o, err := pgrelay.NewOutbox(pgrelay.OutboxConfig{})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return o.Emit(ctx, tx, msgs...) }))
}

// slotConfirmed returns the slot's confirmed_flush_lsn and the server's
// current position, as numbers.
func (b *bundle) slotConfirmed(t *testing.T, slot string) (confirmed, current int64) {
	t.Helper()
	err := b.pool.QueryRow(context.Background(), `SELECT coalesce(pg_wal_lsn_diff(confirmed_flush_lsn, '0/0'), 0)::bigint,
		pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&confirmed, &current)
	require.NoError(t, err)
	return confirmed, current
}

// readAll reads the stream until n messages arrived (or within passed) and
// checks that no more arrive for a moment.
func readAll(t *testing.T, ch <-chan received, n int, within time.Duration) []received {
	t.Helper()
	var got []received
	deadline := time.After(within)
	for len(got) < n {
		select {
		case m := <-ch:
			got = append(got, m)
		case <-deadline:
			t.Fatalf("got %d of %d messages", len(got), n)
		}
	}
	select {
	case m := <-ch:
		t.Fatalf("an extra message: %s (%s)", m.eventID, m.data)
	case <-time.After(300 * time.Millisecond):
	}
	return got
}

// TestWALCapturePublishesCommittedEmits: events written with Emit and with
// the SQL function pgrelay.emit are published once, in commit order, with
// their fields; a rolled-back transaction's are not; no table is touched;
// the slot's confirmed position moves past them.
func TestWALCapturePublishesCommittedEmits(t *testing.T) {
	b, _ := walSetup(t, walConf)
	ch := b.subscribe(t)
	obs := &countingObserver{}
	r, _ := start(t, b.walConfig(t, b.publisher(t), obs))
	waitReading(t, r)

	b.emit(t, pgrelay.Message{EventID: "e1", Topic: "orders", Key: "k", EventType: "Created", Payload: []byte("1"),
		ContentType: "text/plain", Headers: map[string]string{"X-Trace": "t1"}},
		pgrelay.Message{EventID: "e2", Topic: "orders", Key: "k", Payload: []byte("2")})
	ctx := context.Background()
	o, _ := pgrelay.NewOutbox(pgrelay.OutboxConfig{})
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, o.Emit(ctx, tx, pgrelay.Message{EventID: "rolled-back", Topic: "orders", Key: "k", Payload: []byte("x")}))
	require.NoError(t, tx.Rollback(ctx))
	var id string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT pgrelay.emit('orders', convert_to('3', 'UTF8'), key => 'k', event_id => 'e3',
		event_type => 'Paid', headers => '{"X-Trace":"t3"}')`).Scan(&id))
	require.Equal(t, "e3", id)

	got := readAll(t, ch, 3, 20*time.Second)
	for i, m := range got {
		require.Equal(t, fmt.Sprintf("e%d", i+1), m.eventID)
		require.Equal(t, "k", m.key)
		require.Equal(t, fmt.Sprint(i+1), string(m.data))
		require.Equal(t, fmt.Sprint(i+1), hdr(m, event.HeaderKeySeq), "numbered by the relay in commit order")
	}
	require.Equal(t, "t1", hdr(got[0], event.HeaderPrefix+"X-Trace"))
	require.Equal(t, "text/plain", hdr(got[0], event.HeaderContentType))
	require.Equal(t, "Paid", hdr(got[2], event.HeaderEventType))
	require.Equal(t, 0, b.count(t, "pending")+b.count(t, "published"), "no outbox row")
	require.Eventually(t, func() bool {
		confirmed, current := b.slotConfirmed(t, DefaultWALSlot)
		return confirmed >= current-1024 // caught up to the heartbeats
	}, 10*time.Second, 50*time.Millisecond)
}

// flakyPublisher fails every publish while failing is set.
type flakyPublisher struct {
	broker.Publisher
	failing atomic.Bool
	calls   atomic.Int64
}

func (p *flakyPublisher) Publish(ctx context.Context, msgs []pgrelay.Message) []broker.Result {
	p.calls.Add(1)
	if p.failing.Load() {
		res := make([]broker.Result, len(msgs))
		for i := range res {
			res[i].Err = errors.New("broker down (test)")
		}
		return res
	}
	return p.Publisher.Publish(ctx, msgs)
}

// TestWALConfirmsOnlyAcknowledged: while the broker acknowledges nothing the
// slot's confirmed position stays before the events' commit, and a relay
// started after the first stopped reads them again from the slot and
// publishes them, once each.
func TestWALConfirmsOnlyAcknowledged(t *testing.T) {
	b, _ := walSetup(t, walConf)
	ch := b.subscribe(t)
	flaky := &flakyPublisher{Publisher: b.publisher(t)}
	flaky.failing.Store(true)
	cfg := b.walConfig(t, flaky, nil)
	cfg.HeartbeatInterval = 500 * time.Millisecond
	r, stop := start(t, cfg)
	waitReading(t, r)

	b.emit(t, msgs(20, "k", "a")...)
	_, after := b.slotConfirmed(t, DefaultWALSlot)
	require.Eventually(t, func() bool { return flaky.calls.Load() >= 3 }, 10*time.Second, 10*time.Millisecond)
	time.Sleep(1500 * time.Millisecond) // several status updates and heartbeats
	confirmed, _ := b.slotConfirmed(t, DefaultWALSlot)
	require.Less(t, confirmed, after, "the slot confirmed a commit the broker never acknowledged")
	stop()

	start(t, b.walConfig(t, b.publisher(t), nil))
	got := readAll(t, ch, 20, 20*time.Second)
	for i, m := range got {
		require.Equal(t, fmt.Sprint(i+1), string(m.data))
	}
}

func (b *bundle) slotStatusRow(t *testing.T) (bool, error) {
	var active bool
	err := b.pool.QueryRow(context.Background(), `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, DefaultWALSlot).Scan(&active)
	return active, err
}

// TestWALRefusesUnboundedSlot: with max_slot_wal_keep_size unlimited the
// relay does not create its slot unless WAL.AllowUnboundedSlot says so.
func TestWALRefusesUnboundedSlot(t *testing.T) {
	b, _ := walSetup(t, "wal_level = logical")
	r, err := newEngine(b.walConfig(t, b.publisher(t), nil))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = r.run(ctx)
	require.ErrorContains(t, err, "WALAllowUnboundedSlot")
	_, err = b.slotStatusRow(t)
	require.ErrorIs(t, err, pgx.ErrNoRows)

	cfg := b.walConfig(t, b.publisher(t), nil)
	cfg.WALAllowUnboundedSlot = true
	start(t, cfg)
	require.Eventually(t, func() bool { _, err := b.slotStatusRow(t); return err == nil }, 10*time.Second, 20*time.Millisecond)
}

// TestWALStandbyTakesOver: two relays on one slot: one streams, the other
// waits; when the reader stops, the standby takes over and publishes what
// follows, nothing lost.
func TestWALStandbyTakesOver(t *testing.T) {
	b, _ := walSetup(t, walConf)
	ch := b.subscribe(t)
	ra, stopA := start(t, b.walConfig(t, b.publisher(t), nil))
	waitReading(t, ra)
	rb, _ := start(t, b.walConfig(t, b.publisher(t), nil))
	b.emit(t, msgs(10, "k", "a")...)
	readAll(t, ch, 10, 20*time.Second)
	s, ok := rb.WALStatus()
	require.True(t, ok)
	require.False(t, s.Reading, "the second relay is a standby")

	stopA()
	b.emit(t, msgs(10, "k", "b")...)
	got := readAll(t, ch, 10, 20*time.Second)
	require.Equal(t, "1", string(got[0].data))
	require.Eventually(t, func() bool { s, ok := rb.WALStatus(); return ok && s.Reading }, 10*time.Second, 20*time.Millisecond)
}

// TestWALPausedReaderPublishesNothing: a reader paused (reader and publisher
// stopped, as SIGSTOP does) past wal_sender_timeout is cut by the server, the
// standby takes the slot and publishes; the paused relay, woken up,
// publishes and confirms nothing of what it had read.
func TestWALPausedReaderPublishesNothing(t *testing.T) {
	b, _ := walSetup(t, walConf)
	ch := b.subscribe(t)
	obsA, obsB := &countingObserver{}, &countingObserver{}
	var paused atomic.Bool
	release := make(chan struct{})
	var once sync.Once
	pause := func() {
		if paused.Load() {
			<-release
		}
	}
	cfgA := b.walConfig(t, b.publisher(t), obsA)
	cfgA.hooks.walBeforeStatus = pause
	cfgA.hooks.walBeforePublish = func(int) { pause() }
	ra, _ := start(t, cfgA)
	waitReading(t, ra)
	_, _ = start(t, b.walConfig(t, b.publisher(t), obsB))

	paused.Store(true)
	b.emit(t, msgs(10, "k", "a")...)
	readAll(t, ch, 10, 30*time.Second) // by the standby, once A was cut
	require.Equal(t, int64(10), obsB.published.Load())
	once.Do(func() { close(release) })
	time.Sleep(time.Second)
	require.Zero(t, obsA.published.Load(), "the paused relay published what it read before the pause")
	b.emit(t, msgs(5, "k", "b")...)
	readAll(t, ch, 5, 20*time.Second)
}

// TestWALSurvivesPostgresRestart: the reader reconnects after a PostgreSQL
// restart (fast and immediate) and nothing committed is lost.
func TestWALSurvivesPostgresRestart(t *testing.T) {
	b, c := walSetup(t, walConf)
	ch := b.subscribe(t)
	r, _ := start(t, b.walConfig(t, b.publisher(t), nil))
	waitReading(t, r)
	b.emit(t, msgs(10, "k", "a")...)
	readAll(t, ch, 10, 20*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, mode := range []string{"fast", "immediate"} {
		require.NoError(t, c.Restart(ctx, mode))
		require.Eventually(t, func() bool {
			return pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
				o, _ := pgrelay.NewOutbox(pgrelay.OutboxConfig{})
				return o.Emit(ctx, tx, msgs(10, "k-"+mode, mode)...)
			}) == nil
		}, 30*time.Second, 100*time.Millisecond)
		got := readAll(t, ch, 10, 30*time.Second)
		require.Equal(t, "k-"+mode, got[0].key)
	}
}

// TestWALLostSlotFailsLoudly: a slot invalidated for exceeding
// max_slot_wal_keep_size stops the relay with an error naming the recovery.
func TestWALLostSlotFailsLoudly(t *testing.T) {
	b, _ := walSetup(t, "wal_level = logical\nmax_slot_wal_keep_size = '1MB'\nmin_wal_size = '32MB'\nmax_wal_size = '64MB'")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := b.pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, DefaultWALSlot)
	require.NoError(t, err)
	for range 4 {
		_, err := b.pool.Exec(ctx, `SELECT pg_logical_emit_message(false, 'filler', repeat('x', 1024*1024)); SELECT pg_switch_wal()`)
		require.NoError(t, err)
	}
	_, err = b.pool.Exec(ctx, `CHECKPOINT`)
	require.NoError(t, err)
	var status string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1`, DefaultWALSlot).Scan(&status))
	require.Equal(t, "lost", status)

	r, err := newEngine(b.walConfig(t, b.publisher(t), nil))
	require.NoError(t, err)
	err = r.run(ctx)
	require.ErrorIs(t, err, errSlotLost)
	require.True(t, strings.Contains(err.Error(), "docs/wal.md"), err.Error())
}

func hdr(m received, name string) string {
	if v := m.headers[name]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// waitReading waits until r streams its slot: events emitted before the
// slot exists are not in it.
func waitReading(t *testing.T, r *engine) {
	t.Helper()
	require.Eventually(t, func() bool { s, ok := r.WALStatus(); return ok && s.Reading }, 20*time.Second, 20*time.Millisecond)
}

// TestWALQuietDatabaseDoesNotPinWAL: while other databases of the server
// write and this one is quiet, the slot's confirmed position follows the
// server's (heartbeats, and keepalives confirmed while nothing is pending),
// so the slot holds back little WAL.
func TestWALQuietDatabaseDoesNotPinWAL(t *testing.T) {
	b, c := walSetup(t, walConf)
	r, _ := start(t, b.walConfig(t, b.publisher(t), nil))
	waitReading(t, r)
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, `CREATE DATABASE other`)
	require.NoError(t, err)
	other, err := pgx.Connect(ctx, strings.Replace(c.URL(), "/postgres?", "/other?", 1))
	require.NoError(t, err)
	defer other.Close(ctx)
	_, err = other.Exec(ctx, `CREATE TABLE filler (b text); INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 20000)`)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		confirmed, current := b.slotConfirmed(t, DefaultWALSlot)
		return current-confirmed < 1<<20
	}, 20*time.Second, 100*time.Millisecond, "the slot holds back the other database's WAL")
}

// TestWALFastShutdownNotHeldByUnpublishedEvents: a fast shutdown of
// PostgreSQL completes while the relay holds events it cannot publish. The
// server's WAL sender waits for its client to confirm everything it sent
// before it exits, and the relay confirms only what the broker acknowledged,
// so a relay that kept its session alive held the shutdown until pg_ctl gave
// up. Keyed events are numbered before publishing (which fails once the
// server stops); events without a key are not, and only the heartbeat's
// failed status read sees the server stopping.
func TestWALFastShutdownNotHeldByUnpublishedEvents(t *testing.T) {
	for _, key := range []string{"k", ""} {
		t.Run(fmt.Sprintf("key=%q", key), func(t *testing.T) {
			b, c := walSetup(t, walConf)
			flaky := &flakyPublisher{Publisher: b.publisher(t)}
			flaky.failing.Store(true)
			cfg := b.walConfig(t, flaky, nil)
			cfg.HeartbeatInterval = 500 * time.Millisecond
			r, _ := start(t, cfg)
			waitReading(t, r)
			b.emit(t, msgs(5, key, "a")...)
			require.Eventually(t, func() bool { return flaky.calls.Load() >= 2 }, 10*time.Second, 10*time.Millisecond)

			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			began := time.Now()
			require.NoError(t, c.Restart(ctx, "fast"), "the relay held PostgreSQL's fast shutdown")
			t.Logf("fast restart with unpublished events took %s", time.Since(began))

			// Nothing is lost: once the broker is back the events are published.
			ch := b.subscribe(t)
			flaky.failing.Store(false)
			got := readAll(t, ch, 5, 30*time.Second)
			var payloads []string
			for _, m := range got {
				payloads = append(payloads, string(m.data))
			}
			if key == "" {
				slices.Sort(payloads) // events without a key are ordered with no other
			}
			require.Equal(t, []string{"1", "2", "3", "4", "5"}, payloads)
		})
	}
}
