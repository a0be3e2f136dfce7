package relay

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/event"
)

// insertWAL inserts one row per payload into pgrelay.outbox_wal in one
// transaction, with event ids prefix-1, prefix-2, ... and key k.
func (b *bundle) insertWAL(t testing.TB, prefix string, payloads ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		for i, p := range payloads {
			if _, err := tx.Exec(ctx, `INSERT INTO pgrelay.outbox_wal (event_id, topic, key, payload) VALUES ($1, 'orders', 'k', convert_to($2, 'UTF8'))`,
				fmt.Sprintf("%s-%d", prefix, i+1), p); err != nil {
				return err
			}
		}
		return nil
	}))
}

func (b *bundle) walRows(t testing.TB) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM pgrelay.outbox_wal`).Scan(&n))
	return n
}

// TestWALTablePublishesCommittedInserts: rows inserted into
// pgrelay.outbox_wal with plain SQL are published once each, in commit order
// (not insert order), interleaved with emitted events in the order of the
// stream and numbered per key with them, with the fields of the outbox's plain-SQL contract; a rolled-back
// insert is not; the relay empties the table (its TRUNCATE is not read as
// anything) and goes on publishing.
func TestWALTablePublishesCommittedInserts(t *testing.T) {
	b, _ := walSetup(t, walConf)
	ch := b.subscribe(t)
	obs := &countingObserver{}
	cfg := b.walConfig(t, b.publisher(t), obs)
	cfg.WALTruncateInterval = 200 * time.Millisecond
	r, _ := start(t, cfg)
	waitReading(t, r)
	ctx := context.Background()

	// 1: every column, content type and trace context as plain SQL writes them.
	_, err := b.pool.Exec(ctx, `INSERT INTO pgrelay.outbox_wal (event_id, topic, key, event_type, payload, headers, occurred_at, expires_at, traceparent, tracestate)
		VALUES ('e1', 'orders', 'k', 'Created', convert_to('1', 'UTF8'), '{"X-Trace":"t1","Pgrelay-Content-Type":"text/plain"}',
		'2026-01-02 03:04:05.123456+00', '2999-01-01 00:00:00+00', '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01', 'v=1')`)
	require.NoError(t, err)
	// 2..4: an emitted event between two inserts, one transaction.
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO pgrelay.outbox_wal (event_id, topic, key, payload) VALUES ('e2', 'orders', 'k', '\x32')`)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `SELECT pgrelay.emit('orders', '\x33', key => 'k', event_id => 'e3')`)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO pgrelay.outbox_wal (event_id, topic, key, payload) VALUES ('e4', 'orders', 'k', '\x34')`)
		return err
	}))
	// No CHECK on the table: the relay skips a row Enqueue would refuse.
	_, err = b.pool.Exec(ctx, `INSERT INTO pgrelay.outbox_wal (event_id, topic, payload) VALUES ('bad-topic', 'orders.*', '\x78')`)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `INSERT INTO pgrelay.outbox_wal (event_id, topic, payload, headers) VALUES ('bad-headers', 'orders', '\x78', '{"n":1}')`)
	require.NoError(t, err)
	// Rolled back: never published.
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO pgrelay.outbox_wal (event_id, topic, key, payload) VALUES ('rolled-back', 'orders', 'k', '\x78')`)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	// Commit order, not insert order: A inserts first and commits last.
	txA, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = txA.Exec(ctx, `INSERT INTO pgrelay.outbox_wal (event_id, topic, key, payload) VALUES ('e6', 'orders', 'k', '\x36')`)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `INSERT INTO pgrelay.outbox_wal (event_id, topic, key, payload) VALUES ('e5', 'orders', 'k', '\x35')`)
	require.NoError(t, err)
	require.NoError(t, txA.Commit(ctx))
	// Defaults: event id a UUIDv7, key the event id.
	var defID string
	require.NoError(t, b.pool.QueryRow(ctx, `INSERT INTO pgrelay.outbox_wal (topic, payload) VALUES ('orders', '\x37') RETURNING event_id`).Scan(&defID))

	got := readAll(t, ch, 7, 20*time.Second)
	// Order holds per key: the last event has a key of its own.
	for i, m := range got {
		if m.eventID == defID {
			got = append(got[:i:i], append(got[i+1:], m)...)
			break
		}
	}
	for i, m := range got[:6] {
		require.Equal(t, fmt.Sprintf("e%d", i+1), m.eventID)
		require.Equal(t, "k", m.key)
		require.Equal(t, strconv.Itoa(i+1), string(m.data))
		require.Equal(t, strconv.Itoa(i+1), hdr(m, event.HeaderKeySeq), "numbered per key in commit order, emitted or inserted")
	}
	require.Equal(t, defID, got[6].eventID)
	require.Equal(t, defID, got[6].key)
	require.Equal(t, "Created", hdr(got[0], event.HeaderEventType))
	require.Equal(t, "t1", hdr(got[0], event.HeaderPrefix+"X-Trace"))
	require.Equal(t, "text/plain", hdr(got[0], event.HeaderContentType))
	require.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", hdr(got[0], event.HeaderTraceParent))
	require.Equal(t, "v=1", hdr(got[0], event.HeaderTraceState))
	require.Equal(t, "2999-01-01T00:00:00Z", hdr(got[0], event.HeaderExpiresAt))
	require.Equal(t, "2026-01-02T03:04:05.123456Z", hdr(got[0], event.HeaderOccurredAt))
	require.Equal(t, int64(2), obs.dead.Load(), "the rows with a bad topic and bad headers are skipped as dead")

	// Emptied, and the stream goes on after the TRUNCATE.
	require.Eventually(t, func() bool { return b.walRows(t) == 0 }, 10*time.Second, 50*time.Millisecond, "the table was not emptied")
	b.insertWAL(t, "after", "8")
	m := readAll(t, ch, 1, 20*time.Second)[0]
	require.Equal(t, "after-1", m.eventID)
}

// TestWALTableEmptiedBeforeAcknowledgedLosesNothing: the relay empties the
// table while the broker acknowledges nothing; a relay started after it
// re-reads the rows' events from the slot (from its confirmed position, not
// from the table) and publishes each once, in commit order.
func TestWALTableEmptiedBeforeAcknowledgedLosesNothing(t *testing.T) {
	b, _ := walSetup(t, walConf)
	ch := b.subscribe(t)
	flaky := &flakyPublisher{Publisher: b.publisher(t)}
	flaky.failing.Store(true)
	cfg := b.walConfig(t, flaky, nil)
	cfg.WALTruncateInterval = 100 * time.Millisecond
	r, stop := start(t, cfg)
	waitReading(t, r)

	for i := range 4 {
		b.insertWAL(t, fmt.Sprintf("t%d", i), "a", "b", "c", "d", "e")
	}
	require.Eventually(t, func() bool { return flaky.calls.Load() >= 2 }, 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return b.walRows(t) == 0 }, 10*time.Second, 50*time.Millisecond, "the table was not emptied")
	stop()

	start(t, b.walConfig(t, b.publisher(t), nil))
	got := readAll(t, ch, 20, 20*time.Second)
	for i, m := range got {
		require.Equal(t, fmt.Sprintf("t%d-%d", i/5, i%5+1), m.eventID)
	}
}

// TestWALTableAdoptsRowsFromBeforeTheSlot: rows inserted before any relay
// created the slot are not in its stream; the relay, adding the table to its
// publication, re-inserts them, so that they are published and not lost to
// the TRUNCATE that follows.
func TestWALTableAdoptsRowsFromBeforeTheSlot(t *testing.T) {
	b, _ := walSetup(t, walConf)
	ch := b.subscribe(t)
	b.insertWAL(t, "early", "1", "2", "3")
	cfg := b.walConfig(t, b.publisher(t), nil)
	cfg.WALTruncateInterval = 100 * time.Millisecond
	r, _ := start(t, cfg)
	waitReading(t, r)
	got := readAll(t, ch, 3, 20*time.Second)
	for i, m := range got {
		require.Equal(t, fmt.Sprintf("early-%d", i+1), m.eventID)
	}
	require.Eventually(t, func() bool { return b.walRows(t) == 0 }, 10*time.Second, 50*time.Millisecond)
	var member bool
	require.NoError(t, b.pool.QueryRow(context.Background(),
		`SELECT EXISTS (SELECT 1 FROM pg_publication_tables WHERE pubname = $1 AND tablename = 'outbox_wal')`, defaultWALPublication).Scan(&member))
	require.True(t, member)
}

// TestWALTableTruncateGivesWayToProducers: while a producer's transaction
// holds the table (an open insert), the relay's TRUNCATE waits at most
// WAL.LockTimeout in the lock queue, so other producers' inserts are not
// held behind it for longer; the table is emptied once the producer ends.
func TestWALTableTruncateGivesWayToProducers(t *testing.T) {
	b, _ := walSetup(t, walConf)
	ch := b.subscribe(t)
	cfg := b.walConfig(t, b.publisher(t), nil)
	cfg.WALTruncateInterval = 50 * time.Millisecond
	cfg.walLockTimeout = 50 * time.Millisecond
	truncating := make(chan struct{}, 1000)
	cfg.hooks.walBeforeTruncate = func() { truncating <- struct{}{} }
	r, _ := start(t, cfg)
	waitReading(t, r)
	b.insertWAL(t, "first", "1")
	readAll(t, ch, 1, 20*time.Second)

	ctx := context.Background()
	long, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = long.Rollback(context.Background()) }) // before the relay stops
	_, err = long.Exec(ctx, `INSERT INTO pgrelay.outbox_wal (event_id, topic, key, payload) VALUES ('long', 'orders', 'k', '\x31')`)
	require.NoError(t, err)
	b.insertWAL(t, "pre", "1") // a committed row: the relay has something to empty
	for len(truncating) > 0 {
		<-truncating
	}
	var slowest time.Duration
	for i := range 40 {
		select {
		case <-truncating: // a TRUNCATE is (or was just) queued on the lock
		case <-time.After(5 * time.Second):
			t.Fatal("the relay does not try to empty the table")
		}
		t0 := time.Now()
		ictx, cancel := context.WithTimeout(ctx, 3*time.Second)
		_, err := b.pool.Exec(ictx, `INSERT INTO pgrelay.outbox_wal (event_id, topic, key, payload) VALUES ($1, 'orders', 'k', '\x31')`, fmt.Sprintf("p%d", i))
		cancel()
		require.NoError(t, err, "a producer waited behind the relay's TRUNCATE")
		slowest = max(slowest, time.Since(t0))
	}
	require.Less(t, slowest, 1500*time.Millisecond, "a producer waited behind the relay's TRUNCATE")
	require.NoError(t, long.Commit(ctx))
	readAll(t, ch, 42, 20*time.Second)
	require.Eventually(t, func() bool { return b.walRows(t) == 0 }, 10*time.Second, 50*time.Millisecond)
}

// TestWALTableTruncateKeepsRowsWhenTheTableLeftThePublication: the table
// leaves the publication (another relay's leavePublication) between the
// maintenance's membership check and its TRUNCATE, and a row committed in
// that gap is not in the stream; the TRUNCATE must not take it: the relay
// finds the table gone from the publication under the TRUNCATE's lock, rolls
// back, and its next maintenance adopts the row, which is then published.
func TestWALTableTruncateKeepsRowsWhenTheTableLeftThePublication(t *testing.T) {
	b, _ := walSetup(t, walConf)
	ch := b.subscribe(t)
	cfg := b.walConfig(t, b.publisher(t), nil)
	cfg.WALTruncateInterval = 100 * time.Millisecond
	var armed atomic.Bool
	armed.Store(true)
	gap := make(chan error, 1)
	cfg.hooks.walBeforeTruncate = func() {
		if !armed.CompareAndSwap(true, false) {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := b.pool.Exec(ctx, `ALTER PUBLICATION `+defaultWALPublication+` DROP TABLE pgrelay.outbox_wal`)
		if err == nil {
			_, err = b.pool.Exec(ctx, `INSERT INTO pgrelay.outbox_wal (event_id, topic, key, payload) VALUES ('gap-1', 'orders', 'k', '\x32')`)
		}
		gap <- err
	}
	r, _ := start(t, cfg)
	waitReading(t, r)
	b.insertWAL(t, "first", "1") // something to empty: the hook runs before its TRUNCATE

	select {
	case err := <-gap:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("the relay did not try to empty the table")
	}
	got := readAll(t, ch, 2, 20*time.Second)
	require.Equal(t, []string{"first-1", "gap-1"}, []string{got[0].eventID, got[1].eventID})
	require.Eventually(t, func() bool { return b.walRows(t) == 0 }, 10*time.Second, 50*time.Millisecond, "the table was not emptied")
}
