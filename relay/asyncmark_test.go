package relay

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/db"
)

// TestMarkCommitsAsynchronouslyForItsTransactionOnly checks what the fast
// path is: the mark statement turns synchronous_commit off for its own
// transaction (AsyncMarks), keeps the server's setting otherwise, and
// leaves nothing behind on the connection, so a pooler
// in transaction mode hands it on unchanged.
func TestMarkCommitsAsynchronouslyForItsTransactionOnly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b.enqueue(t, msgs(1, "order-1", "a")...)
	p := b.partitionOf(t, "order-1")
	_, err := b.pool.Exec(ctx, `INSERT INTO pgrelay.relay_partitions (partition, owner, epoch, lease_until)
		VALUES ($1, 'test', 7, now() + interval '1 hour')
		ON CONFLICT (partition) DO UPDATE SET owner = 'test', epoch = 7, lease_until = now() + interval '1 hour'`, p)
	require.NoError(t, err)
	var id int64
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT id FROM pgrelay.outbox`).Scan(&id))

	conn, err := b.pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	var server string
	require.NoError(t, conn.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&server))
	for _, async := range []bool{true, false} {
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		marked, err := db.New().MarkOutcomesMany(ctx, tx, db.MarkOutcomesManyParams{Partitions: []int32{p}, Owner: "test", Epochs: []int64{7},
			Ids: []int64{id}, DeadIds: []int64{}, DeadReasons: []string{}, AsyncCommit: async})
		require.NoError(t, err)
		require.Len(t, marked, 1)
		require.Positive(t, marked[0].Xid, "the mark's transaction")
		marked[0].Xid = 0
		require.Equal(t, []db.MarkOutcomesManyRow{{Partition: p, Marked: 1}}, marked)
		var inTx string
		require.NoError(t, tx.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&inTx))
		require.NoError(t, tx.Rollback(ctx))
		want := server
		if async {
			want = "off"
		}
		require.Equal(t, want, inTx, "synchronous_commit inside the mark's transaction (async %v)", async)
	}
	var after string
	require.NoError(t, conn.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&after))
	require.Equal(t, server, after, "the setting ends with the mark's transaction")
}

// TestLostMarkIsRepublishedOnce is the safety of asynchronous marks: a
// server crash that loses marks whose commit had not reached the disk leaves
// those rows pending, as a relay crash between publish and mark does. The
// relay publishes them again and the broker drops every republished message
// as a duplicate (Nats-Msg-Id = event id), so the stream holds each event
// once. Without the dedup id the stream would hold them twice.
func TestLostMarkIsRepublishedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	obs := &countingObserver{}
	cfg := b.testConfig(t, b.publisher(t), obs)
	cfg.AsyncMarks = true
	start(t, cfg)
	b.enqueue(t, msgs(20, "order-1", "lost")...)
	b.waitCount(t, "published", 20, 15*time.Second)
	require.Equal(t, uint64(20), b.streamMsgs(t))

	// What the table holds after a crash that lost the asynchronous marks:
	// the rows as they were before them.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE pgrelay.outbox SET status = 'pending', published_at = NULL, attempts = attempts - 1`)
		return err
	}))

	b.waitCount(t, "published", 20, 15*time.Second)
	eventually(t, func() bool { return obs.duplicates.Load() == 20 }, "the broker dropped every republished message as a duplicate")
	require.Equal(t, uint64(20), b.streamMsgs(t), "each event is in the stream once")
	require.EqualValues(t, 40, obs.published.Load(), "the rows were published twice")
}

// TestNextBatchSkipsTheRowsBeingMarked: a full batch's mark runs while the
// worker reads and publishes the next rows. Held at the mark here, the first
// batch's rows are still pending when the second read runs (rows committed
// while the first batch was being published); that read excludes them, so
// nothing is published twice, and the second batch's mark waits for the
// first. Reading without the exclusion publishes the first batch again
// (JetStream reports the duplicates).
func TestNextBatchSkipsTheRowsBeingMarked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	obs := &countingObserver{}
	cfg := b.testConfig(t, b.publisher(t), obs)
	cfg.BatchSize = 5 // the first batch is full
	p := b.partitionOf(t, "order-1")
	var marks, publishes atomic.Int32
	release := make(chan struct{})
	var readWhileMarking atomic.Int32
	var holding atomic.Bool
	enqueued := make(chan error, 1)
	cfg.hooks.afterPublish = func(part int32, _ []int64) {
		if part == p && publishes.Add(1) == 1 {
			// The next rows commit while the first batch is in flight.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			o, err := newOutboxForTest()
			if err == nil {
				err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return o.Enqueue(ctx, tx, msgs(5, "order-1", "second")...) })
			}
			// From here until release the first batch's mark cannot
			// complete (beforeMark holds it): a read now is a read while
			// it is being marked, whether or not the mark's goroutine has
			// reached beforeMark yet.
			holding.Store(true)
			enqueued <- err
		}
	}
	cfg.hooks.beforeMark = func(part int32, _ []int64) {
		if part == p && marks.Add(1) == 1 {
			select {
			case <-release:
			case <-time.After(20 * time.Second):
			}
			holding.Store(false)
		}
	}
	cfg.hooks.afterRead = func(part int32, rows int) {
		if part == p && rows > 0 && holding.Load() {
			readWhileMarking.Add(int32(rows))
		}
	}
	start(t, cfg)
	b.enqueue(t, msgs(5, "order-1", "first")...)
	require.NoError(t, <-enqueued)
	eventually(t, func() bool { return readWhileMarking.Load() == 5 }, "the second batch was read while the first was being marked, without its rows")
	eventually(t, func() bool { return b.streamMsgs(t) == 10 }, "both batches published")
	require.Equal(t, 10, b.count(t, "pending"), "nothing is marked before the first mark")
	close(release)
	b.waitCount(t, "published", 10, 15*time.Second)
	require.Zero(t, obs.duplicates.Load(), "nothing was published twice")
	require.Equal(t, uint64(10), b.streamMsgs(t))
}
