package relay

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/db"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// dbNow reads the database's clock.
func (b *bundle) dbNow(t *testing.T) time.Time {
	t.Helper()
	var now time.Time
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&now))
	return now
}

// rowTimes returns the status, not_before and published_at of one event.
func (b *bundle) rowTimes(t *testing.T, eventID string) (status string, notBefore, publishedAt *time.Time) {
	t.Helper()
	require.NoError(t, b.pool.QueryRow(context.Background(),
		`SELECT status, not_before, published_at FROM pgrelay.outbox WHERE event_id = $1`, eventID).Scan(&status, &notBefore, &publishedAt))
	return status, notBefore, publishedAt
}

// keysIn returns n keys of partition p, named prefix-i.
func (b *bundle) keysIn(t *testing.T, p int32, prefix string, n int) []string {
	var out []string
	for i := 0; len(out) < n; i++ {
		if k := fmt.Sprintf("%s-%d", prefix, i); b.partitionOf(t, k) == p {
			out = append(out, k)
		}
	}
	return out
}

// TestDelayedEventIsPublishedAtItsTime: events delayed by Delay (the
// database's clock) and by NotBefore are published at or after their time,
// never before, and the idle worker wakes for them by its timer: the poll
// interval here is far longer than the delay.
func TestDelayedEventIsPublishedAtItsTime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.testConfig(t, b.publisher(t), &countingObserver{})
	cfg.PollInterval = time.Minute
	start(t, cfg)
	// An event at once first: the worker is then idle, armed, with a
	// minute to its next poll.
	b.enqueue(t, pgrelay.Message{EventID: "now", Topic: "orders", Key: "k-now"})
	b.waitCount(t, "published", 1, 10*time.Second)

	b.enqueue(t,
		pgrelay.Message{EventID: "delay", Topic: "orders", Key: "k-delay", Delay: 1500 * time.Millisecond},
		pgrelay.Message{EventID: "not-before", Topic: "orders", Key: "k-nb", NotBefore: b.dbNow(t).Add(2 * time.Second)})
	time.Sleep(500 * time.Millisecond) // inside the delays: nothing may be published yet
	require.Equal(t, 2, b.count(t, "pending"), "published before its time")
	b.waitCount(t, "published", 3, 10*time.Second)
	for _, id := range []string{"delay", "not-before"} {
		status, nb, at := b.rowTimes(t, id)
		require.Equal(t, "published", status)
		require.NotNil(t, nb, "%s has a not_before", id)
		require.False(t, at.Before(*nb), "%s published at %s, before its not_before %s", id, at, nb)
	}
}

// TestDelayedEventHoldsItsKey: a delayed event holds its key's later events
// until it is published, then both go in key order; the key's earlier event
// and the events of other keys of the same partition are not held.
func TestDelayedEventHoldsItsKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key := "held"
	other := b.keysIn(t, b.partitionOf(t, key), "other", 1)[0]
	b.enqueue(t, pgrelay.Message{EventID: "held-1", Topic: "orders", Key: key, Payload: []byte("1")})
	b.enqueue(t, pgrelay.Message{EventID: "held-2", Topic: "orders", Key: key, Payload: []byte("2"), Delay: 2 * time.Second})
	b.enqueue(t, pgrelay.Message{EventID: "held-3", Topic: "orders", Key: key, Payload: []byte("3")})
	b.enqueue(t, pgrelay.Message{EventID: "other-1", Topic: "orders", Key: other, Payload: []byte("1")})
	sub := b.subscribe(t)
	start(t, b.testConfig(t, b.publisher(t), &countingObserver{}))

	// held-1 and other-1 go at once; held-2 waits, and held-3 behind it.
	b.waitCount(t, "published", 2, 5*time.Second)
	for _, id := range []string{"held-1", "other-1"} {
		status, _, _ := b.rowTimes(t, id)
		require.Equal(t, "published", status, id)
	}
	time.Sleep(300 * time.Millisecond)
	status, _, _ := b.rowTimes(t, "held-3")
	require.Equal(t, "pending", status, "the key's later event must wait for its delayed event")

	b.waitCount(t, "published", 4, 10*time.Second)
	_, nb2, at2 := b.rowTimes(t, "held-2")
	_, _, at3 := b.rowTimes(t, "held-3")
	require.False(t, at2.Before(*nb2), "held-2 published before its time")
	require.False(t, at3.Before(*nb2), "held-3 published before the delayed event it follows")

	var order []string
	deadline := time.After(10 * time.Second)
	for len(order) < 4 {
		select {
		case m := <-sub:
			if m.key == key {
				order = append(order, m.eventID)
			} else {
				order = append(order, "other")
			}
		case <-deadline:
			t.Fatalf("stream has %v", order)
		}
	}
	var keyOrder []string
	for _, id := range order {
		if id != "other" {
			keyOrder = append(keyOrder, id)
		}
	}
	require.Equal(t, []string{"held-1", "held-2", "held-3"}, keyOrder, "the key's events in order")
	require.Less(t, slices.Index(order, "other"), slices.Index(order, "held-2"), "the other key's event was not held: it went before the delayed one")
}

// TestFarFutureEventCostsNothing: an event delayed by a year is never
// published and causes no repeated claims: the idle worker reads its
// partition at its poll pace, not in a loop.
func TestFarFutureEventCostsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key := "far"
	p := b.partitionOf(t, key)
	var reads atomic.Int64
	cfg := b.testConfig(t, b.publisher(t), &countingObserver{})
	cfg.PollInterval = 500 * time.Millisecond
	cfg.hooks.afterRead = func(part int32, _ int) {
		if part == p {
			reads.Add(1)
		}
	}
	// The far-future event, then events of the same partition at once: the
	// worker has had rows (it lingers) and then goes idle.
	b.enqueue(t, pgrelay.Message{EventID: "far", Topic: "orders", Key: key, NotBefore: time.Now().Add(365 * 24 * time.Hour)})
	others := b.keysIn(t, p, "near", 3)
	for _, k := range others {
		b.enqueue(t, pgrelay.Message{Topic: "orders", Key: k})
	}
	start(t, cfg)
	b.waitCount(t, "published", len(others), 10*time.Second)
	time.Sleep(500 * time.Millisecond) // past the linger
	before := reads.Load()
	time.Sleep(3 * time.Second)
	n := reads.Load() - before
	// Each poll reads at most twice (before and after arming): 6 polls in
	// 3 s at 500 ms, with jitter. A busy loop reads thousands of times.
	require.LessOrEqual(t, n, int64(20), "the far-future event made the worker claim %d times in 3 s", n)
	require.Equal(t, 1, b.count(t, "pending"))
	status, _, _ := b.rowTimes(t, "far")
	require.Equal(t, "pending", status)
}

// TestExpiredEventEndsDead: an event whose expires_at passed before the
// relay could publish it is marked dead with the reason "expired", counted,
// and never reaches the broker; an event with a later expiry is published
// with the Pgrelay-Expires-At header; a delayed event that expires before it
// falls due is never published either.
func TestExpiredEventEndsDead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := b.dbNow(t)
	later := now.Add(time.Hour).Round(time.Microsecond)
	b.enqueue(t,
		pgrelay.Message{EventID: "gone", Topic: "orders", Key: "e", ExpiresAt: now.Add(-time.Second)},
		pgrelay.Message{EventID: "kept", Topic: "orders", Key: "e", ExpiresAt: later},
		pgrelay.Message{EventID: "late", Topic: "orders", Key: "l", Delay: time.Second, ExpiresAt: now.Add(500 * time.Millisecond)})
	sub := b.subscribe(t)
	obs := &countingObserver{}
	start(t, b.testConfig(t, b.publisher(t), obs))
	b.waitCount(t, "dead", 2, 10*time.Second)
	b.waitCount(t, "published", 1, 10*time.Second)
	for _, id := range []string{"gone", "late"} {
		var status, reason string
		require.NoError(t, b.pool.QueryRow(context.Background(),
			`SELECT status, last_error FROM pgrelay.outbox WHERE event_id = $1`, id).Scan(&status, &reason))
		require.Equal(t, "dead", status, id)
		require.Equal(t, "expired", reason, id)
	}
	require.Equal(t, int64(2), obs.expired.Load())
	require.Zero(t, obs.dead.Load(), "expired events are not counted as broker rejections")
	select {
	case m := <-sub:
		require.Equal(t, "kept", m.eventID)
		got, err := time.Parse(time.RFC3339Nano, m.headers[event.HeaderExpiresAt][0])
		require.NoError(t, err)
		require.True(t, got.Equal(later), "header %s, want %s", got, later)
	case <-time.After(5 * time.Second):
		t.Fatal("the unexpired event was not published")
	}
	require.Equal(t, uint64(1), b.streamMsgs(t), "the expired events never reached the broker")
}

// TestExpiredDelayedEventReleasesItsKey: a delayed event that expires before
// it falls due can never be published, so it holds its key's later events
// not at all: the event due in an hour that expires in a second does not
// hold its key for the hour, nor the one due in 5 s for the 5 s; the latter
// ends dead as expired when it falls due, and neither reaches the broker.
func TestExpiredDelayedEventReleasesItsKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := b.dbNow(t)
	b.enqueue(t,
		pgrelay.Message{EventID: "hour-1", Topic: "orders", Key: "hour", NotBefore: now.Add(time.Hour), ExpiresAt: now.Add(time.Second)},
		pgrelay.Message{EventID: "hour-2", Topic: "orders", Key: "hour"},
		pgrelay.Message{EventID: "soon-1", Topic: "orders", Key: "soon", NotBefore: now.Add(5 * time.Second), ExpiresAt: now.Add(time.Second)},
		pgrelay.Message{EventID: "soon-2", Topic: "orders", Key: "soon"})
	sub := b.subscribe(t)
	obs := &countingObserver{}
	start(t, b.testConfig(t, b.publisher(t), obs))

	b.waitCount(t, "published", 2, 20*time.Second)
	_, nb, _ := b.rowTimes(t, "soon-1")
	_, _, at := b.rowTimes(t, "soon-2")
	require.True(t, at.Before(*nb), "soon-2 published at %s, held by its expired predecessor until %s", at, nb)
	b.waitCount(t, "dead", 1, 20*time.Second)
	var status, reason string
	require.NoError(t, b.pool.QueryRow(context.Background(),
		`SELECT status, last_error FROM pgrelay.outbox WHERE event_id = 'soon-1'`).Scan(&status, &reason))
	require.Equal(t, []string{"dead", "expired"}, []string{status, reason})
	status, _, _ = b.rowTimes(t, "hour-1")
	require.Equal(t, "pending", status, "dead as expired when it falls due, not before")
	require.Equal(t, int64(1), obs.expired.Load())
	var got []string
	for range 2 {
		select {
		case m := <-sub:
			got = append(got, m.eventID)
		case <-time.After(5 * time.Second):
			t.Fatalf("stream has %v", got)
		}
	}
	slices.Sort(got)
	require.Equal(t, []string{"hour-2", "soon-2"}, got)
	require.Equal(t, uint64(2), b.streamMsgs(t), "the expired events never reached the broker")
}

// TestClaimSkipsFarFutureRows: a partition holding 10,000 rows due next year
// (and nothing due) is claimed and probed for its next due time without
// walking them: both statements read a handful of buffers, where walking the
// rows' index entries reads some fifty.
func TestClaimSkipsFarFutureRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p := b.partitionOf(t, "far")
	// Rows without a key (their key is their event id: no key lock), those
	// of partition p.
	tag, err := b.pool.Exec(ctx, `INSERT INTO pgrelay.outbox (event_id, topic, not_before)
		SELECT 'far-' || g, 'orders', now() + interval '1 year' + g * interval '1 second'
		FROM generate_series(1, 200000) AS g
		WHERE pgrelay.outbox_partition('far-' || g) = $1
		LIMIT 10000`, p)
	require.NoError(t, err)
	require.EqualValues(t, 10000, tag.RowsAffected())
	_, err = b.pool.Exec(ctx, `VACUUM ANALYZE pgrelay.outbox`)
	require.NoError(t, err)

	ex := &testdb.Explain{DBTX: b.pool}
	_, err = db.New().PendingBatch(ctx, ex, db.PendingBatchParams{Partition: p, BatchSize: 500, Exclude: []int64{}})
	require.ErrorIs(t, err, testdb.ErrExplained)
	root := ex.Root(t)
	require.Zero(t, root.ActualRows, "nothing is due")
	buffers := root.SharedHit + root.SharedRead
	t.Logf("claim of a partition holding 10,000 far-future rows: %d buffers", buffers)
	require.LessOrEqual(t, buffers, 12, "the claim walked the far-future rows: %s", ex.JSON)

	// The busy poll's read runs the same query per partition.
	ex = &testdb.Explain{DBTX: b.pool}
	_, err = db.New().PendingBatchMany(ctx, ex, db.PendingBatchManyParams{Partitions: []int32{p}, Afters: []int64{0}, BatchSize: 500})
	require.ErrorIs(t, err, testdb.ErrExplained)
	root = ex.Root(t)
	require.Zero(t, root.ActualRows, "nothing is due")
	buffers = root.SharedHit + root.SharedRead
	t.Logf("busy poll of a partition holding 10,000 far-future rows: %d buffers", buffers)
	require.LessOrEqual(t, buffers, 12, "the busy poll walked the far-future rows: %s", ex.JSON)
	// Four partitions, p among them: each costs what p alone does.
	ex = &testdb.Explain{DBTX: b.pool}
	_, err = db.New().PendingBatchMany(ctx, ex, db.PendingBatchManyParams{Partitions: []int32{p, (p + 1) % 16, (p + 2) % 16, (p + 3) % 16}, Afters: make([]int64, 4), BatchSize: 500})
	require.ErrorIs(t, err, testdb.ErrExplained)
	root = ex.Root(t)
	buffers = root.SharedHit + root.SharedRead
	t.Logf("busy poll of four partitions, one holding 10,000 far-future rows: %d buffers", buffers)
	require.True(t, root.Uses("outbox_pending_idx"), "the busy poll must use the pending partial index: %s", ex.JSON)
	require.LessOrEqual(t, buffers, 4*12, "the busy poll walked the far-future rows: %s", ex.JSON)

	ex = &testdb.Explain{DBTX: b.pool}
	_, err = db.New().NextDue(ctx, ex, p)
	require.ErrorIs(t, err, testdb.ErrExplained)
	root = ex.Root(t)
	buffers = root.SharedHit + root.SharedRead
	t.Logf("next due time of a partition holding 10,000 far-future rows: %d buffers", buffers)
	require.LessOrEqual(t, buffers, 12, "the next due time walked the far-future rows: %s", ex.JSON)
}

// TestSentEventIsNotMarkedExpired: an event the broker confirmed whose mark
// is lost, read again after its expires_at, is published again and marked
// published, not dead as expired: the broker holds it, and the outbox says
// so. The mark fails (the connection reset under it), or is fenced (the
// partition taken over meanwhile: its next owner knows nothing the relay
// kept in memory; here the same relay takes it back once the taker's lease
// lapses). Both are red without the note NoteSending leaves on the row
// before publishing.
func TestSentEventIsNotMarkedExpired(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"mark failed", "mark fenced"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			expires := b.dbNow(t).Add(time.Second)
			b.enqueue(t, pgrelay.Message{EventID: "sent-1", Topic: "orders", Key: "k", ExpiresAt: expires})
			obs := &countingObserver{}
			cfg := b.testConfig(t, b.publisher(t), obs)
			pool, err := pgxpool.New(context.Background(), b.dbURL+"&application_name=relay_under_test")
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			cfg.Pool = pool
			var once sync.Once
			cfg.hooks.beforeMark = func(p int32, _ []int64) {
				once.Do(func() {
					time.Sleep(time.Until(expires) + 200*time.Millisecond) // past the expiry
					var err error
					if how == "mark failed" {
						// The relay's sessions end: the mark meets a dead connection.
						_, err = b.pool.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
							WHERE datname = current_database() AND application_name = 'relay_under_test'`)
					} else {
						_, err = b.pool.Exec(context.Background(), `UPDATE pgrelay.relay_partitions
							SET owner = 'taker', epoch = epoch + 1, lease_until = now() + interval '1 second' WHERE partition = $1`, p)
					}
					assert.NoError(t, err)
				})
			}
			start(t, cfg)
			require.Eventually(t, func() bool { return b.count(t, "pending") == 0 }, 30*time.Second, 20*time.Millisecond)
			var status, reason string
			require.NoError(t, b.pool.QueryRow(context.Background(),
				`SELECT status, coalesce(last_error, '') FROM pgrelay.outbox WHERE event_id = 'sent-1'`).Scan(&status, &reason))
			require.Equal(t, "published", status, "the broker has it (last_error %q)", reason)
			require.Equal(t, uint64(1), b.streamMsgs(t), "published again, absorbed as a duplicate")
			if how == "mark fenced" {
				require.Positive(t, obs.fenced.Load(), "the mark was fenced")
			}
		})
	}
}
