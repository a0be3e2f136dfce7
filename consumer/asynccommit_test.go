package consumer

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	pgnats "github.com/pgrelay/pgrelay/broker/nats"
	"github.com/pgrelay/pgrelay/internal/ledger"
	"github.com/pgrelay/pgrelay/internal/ledger/ledgertest"
	"github.com/pgrelay/pgrelay/internal/logtest"
	"github.com/pgrelay/pgrelay/internal/testcluster"
	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/internal/testnats"
)

// TestAsyncCommitLostInACrashIsRedelivered is AsyncCommit's guarantee: a
// batch stored and applied by a transaction committed asynchronously is not
// acknowledged until its commit is flushed, so when the server stops at once
// (pg_ctl stop -m immediate) with the commit not yet written, the commit is
// lost but the broker still holds the message: it is redelivered and
// credited exactly once. The cluster's WAL writer waits 10s between writes
// and the acker never forces a flush here, so the commit stays in the
// server's WAL buffers until the stop.
func TestAsyncCommitLostInACrashIsRedelivered(t *testing.T) {
	t.Parallel()
	cluster := testcluster.Start(t, "wal_writer_delay = '10s'\nwal_writer_flush_after = '1GB'\n"+
		"autovacuum = off\nbgwriter_lru_maxpages = 0\ncheckpoint_timeout = '1h'\nmax_wal_size = '1GB'")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, cluster.URL())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = pool.Exec(ctx, `CREATE TABLE async_credits (event_id text NOT NULL, amount bigint NOT NULL)`)
	require.NoError(t, err)
	credits := func() (n int) {
		qctx, qcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer qcancel()
		if err := pool.QueryRow(qctx, `SELECT count(*) FROM async_credits`).Scan(&n); err != nil {
			return -1
		}
		return n
	}

	url := testnats.URL(t)
	stream, prefix := testnats.Stream(t, url)
	_, js := testnats.Connect(t, url)
	b := &testBundle{pool: pool, js: js, stream: stream, prefix: prefix, nats: pgnats.Config{
		URL: url, Stream: stream, SubjectPrefix: prefix, Durable: "test",
		AckWait: 2 * time.Second, MaxAckPending: 200, MaxPayloadBytes: 1 << 20,
	}, cfg: Config{
		Pool: pool, FetchBatchSize: 20, MaxWait: 100 * time.Millisecond,
		RetryMin: 10 * time.Millisecond, RetryMax: 200 * time.Millisecond, StatsInterval: -1,
		AsyncCommit:     true,
		AsyncFlushAfter: time.Hour, // never forced: only the server's own flushes count
		Inbox: pgrelay.InboxConfig{
			Handler: pgrelay.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
				_, err := tx.Exec(ctx, `INSERT INTO async_credits VALUES ($1, 100)`, ev.EventID)
				return err
			}),
			PollInterval: 50 * time.Millisecond, BackoffMin: 10 * time.Millisecond,
			BackoffMax: 100 * time.Millisecond, DeferFallback: 200 * time.Millisecond,
		},
		Logger: logtest.New(t),
	}}
	c, err := newConsumer(b.config())
	require.NoError(t, err)
	stop := b.start(t, c)
	require.Eventually(t, c.Ready, 10*time.Second, 10*time.Millisecond)
	// A commit sent before the acker's connection opened is never
	// acknowledged (it cannot be proven flushed): wait for it.
	require.Eventually(t, c.walReaderOpen.Load, 10*time.Second, time.Millisecond)

	b.publish(t, "pay-1", "pay-1", "Paid", map[string]int{"amount": 100})
	require.Eventually(t, func() bool { return c.Stats().AppliedOnReceive == 1 }, 10*time.Second, time.Millisecond)
	require.Equal(t, 1, credits(), "applied on receive (the asynchronous commit is visible at once)")
	time.Sleep(50 * time.Millisecond) // time enough for an acknowledgement sent too early
	t.Logf("acknowledged before the stop: %d", c.Stats().Acked)

	require.NoError(t, cluster.Restart(ctx, "immediate"))
	require.Eventually(t, func() bool { return credits() >= 0 }, 30*time.Second, 20*time.Millisecond)
	var stored int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pgrelay.inbox`).Scan(&stored))
	require.Zero(t, stored+credits(), "the commit was not lost: the WAL writer wrote it before the stop (its wal_writer_delay "+
		"wake-up fell in the moment between the commit and the stop); the scenario proves nothing this time, run again")

	require.Eventually(t, func() bool { return credits() == 1 }, 20*time.Second, 20*time.Millisecond,
		"the credit was lost: the message was acknowledged before its commit was flushed, so the broker did not redeliver it")
	// Every later redelivery is absorbed: still one credit after one more ack wait.
	require.Eventually(t, func() bool {
		cons, err := js.Consumer(ctx, stream, "test")
		if err != nil {
			return false
		}
		info, err := cons.Info(ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	}, 20*time.Second, 20*time.Millisecond, "the redelivered message was acknowledged once its commit was flushed")
	time.Sleep(b.nats.AckWait + 500*time.Millisecond)
	require.Equal(t, 1, credits(), "credited exactly once")
	require.NoError(t, stop())
}

// TestAsyncCommitSettles runs orders through a consumer with AsyncCommit,
// with one ingest loop and with two: every order is
// credited once and every delivery acknowledged (the forced flushes ack what
// the server does not flush by itself), and a stop right after a publish
// leaves nothing unacknowledged.
func TestAsyncCommitSettles(t *testing.T) {
	t.Parallel()
	for _, loops := range []int{1, 2} {
		b := setup(t)
		b.cfg.AsyncCommit = true
		b.cfg.IngestLoops = loops
		c, err := newConsumer(b.config())
		require.NoError(t, err)
		stop := b.start(t, c)
		const orders = 40
		total := b.publishOrders(t, orders)
		require.Eventually(t, b.settled(t, orders, total, 2*orders), 30*time.Second, 20*time.Millisecond)
		require.Equal(t, int64(2*orders), c.Stats().Acked)

		b.publish(t, "created-late", "created-late", "OrderCreated",
			map[string]any{"order_id": "late", "customer_id": "c", "amount_cents": 1, "currency": "EUR"})
		require.Eventually(t, func() bool { return c.Stats().Inserted == 2*orders+1 }, 10*time.Second, time.Millisecond)
		require.NoError(t, stop())
		require.Equal(t, int64(2*orders+1), c.Stats().Acked, "the stop acknowledged the batch waiting for its flush")
	}
}

// TestWALSessionForcesTheFlush checks the acker's session against a server
// whose WAL writer waits 10s: an asynchronous commit (beginFunc with a mark)
// is not flushed at once; the forced flush flushes it, even when the
// session's synchronous_commit is off.
func TestWALSessionForcesTheFlush(t *testing.T) {
	t.Parallel()
	cluster := testcluster.Start(t, "wal_writer_delay = '10s'\nwal_writer_flush_after = '1GB'\n"+
		"autovacuum = off\nbgwriter_lru_maxpages = 0\ncheckpoint_timeout = '1h'")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, cluster.URL())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = pool.Exec(ctx, `CREATE TABLE async_rows (n int)`)
	require.NoError(t, err)
	c := &Consumer{cfg: Config{Pool: pool, AsyncCommit: true}}

	sess, err := dialWAL(pool)(ctx)
	require.NoError(t, err)
	defer sess.close()
	_, err = sess.(*pgSession).conn.Exec(ctx, "SET synchronous_commit TO off")
	require.NoError(t, err)

	var m commitMark
	require.NoError(t, c.beginFunc(ctx, &m, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO async_rows VALUES (1)`)
		return err
	}))
	require.Equal(t, 1, m.n)
	require.Equal(t, sess.server(), m.server)
	require.True(t, sess.since().Before(m.sent))
	var syncCommit string
	require.NoError(t, pool.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&syncCommit))
	require.Equal(t, "on", syncCommit, "the asynchronous commit left nothing in the session")

	flushed, needSync, err := sess.flushed(ctx)
	require.NoError(t, err)
	require.False(t, needSync)
	require.Less(t, flushed, m.lsn, "the asynchronous commit was flushed at once")
	require.NoError(t, sess.forceFlush(ctx))
	flushed, _, err = sess.flushed(ctx)
	require.NoError(t, err)
	require.GreaterOrEqual(t, flushed, m.lsn, "the forced flush did not flush the commit")

	// A commit that fails is not marked.
	before := m
	require.Error(t, c.beginFunc(ctx, &m, func(tx pgx.Tx) error {
		_, _ = tx.Exec(ctx, `SELECT 1/0`)
		return nil // commit of an aborted transaction: a rollback
	}))
	require.Equal(t, before, m)
}

// TestAsyncCommitRoundTrips: with AsyncCommit a batch costs the round trips
// it costs without (BEGIN, the store, with apply on receive the handler's,
// COMMIT): the setting rides on BEGIN and the WAL position on COMMIT, and
// the connection's tracer sees both.
func TestAsyncCommitRoundTrips(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, trips := testdb.RoundTripPool(t, 0)
	c, err := newConsumer(Config{
		Pool:          pool,
		Subscribe:     func(context.Context) (broker.Subscriber, error) { return &oneShotSubscriber{}, nil },
		StatsInterval: -1,
		AsyncCommit:   true,
		Inbox:         pgrelay.InboxConfig{Handler: ledgertest.Traced{Trips: trips}},
		Logger:        logtest.New(t),
	})
	require.NoError(t, err)
	for i, apply := range []bool{false, true} {
		order := fmt.Sprintf("o-%d", i)
		payload, err := json.Marshal(ledger.OrderCreated{OrderID: order, CustomerID: "c", AmountCents: 100, Currency: "EUR"})
		require.NoError(t, err)
		batch := []pgrelay.Incoming{{Message: pgrelay.Message{EventID: "created-" + order, Topic: "orders", EventType: ledger.EventOrderCreated,
			Payload: payload, OccurredAt: time.Now()}}}
		trips.Reset()
		var m commitMark
		require.NoError(t, c.store(ctx, batch, apply, &m))
		got, inHandler := trips.Reset()
		require.Equal(t, 1, m.n)
		commit := slices.Index(got, asyncCommitSQL)
		require.Positive(t, commit, "the tracer did not see the commit: %q", got)
		got = got[:commit+1]
		require.Equal(t, asyncBeginSQL, got[0])
		require.Equal(t, 3, len(got)-inHandler, "apply %v: BEGIN, the store and COMMIT besides the handler's statements, got %q", apply, got)
	}
	var syncCommit string
	require.NoError(t, pool.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&syncCommit))
	require.Equal(t, "on", syncCommit, "the asynchronous commit left nothing in the session")
}
