package pgrelay_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/db"
	"github.com/pgrelay/pgrelay/internal/inboxtest"
	"github.com/pgrelay/pgrelay/internal/ledger/ledgertest"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// TestOptimisticBatchRoundTrips: a claimed batch that commits costs the
// claim, BEGIN, the handler's statements and one round trip for the mark and
// the COMMIT together (a batch of one event and batches of several, run by
// Handle and by HandleBatch). Sending the COMMIT on its own after the mark
// (5 round trips with the ledger's HandleBatch) turns this red.
func TestOptimisticBatchRoundTrips(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe} {
		t.Run(mode.String(), func(t *testing.T) { testOptimisticBatchRoundTrips(t, mode) })
	}
}

func testOptimisticBatchRoundTrips(t *testing.T, mode pgx.QueryExecMode) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, trips := testdb.RoundTripPool(t, mode)

	stats := &inboxtest.CountingObserver{}
	cfg := fastConfig(t, pool, ledgertest.Traced{Trips: trips})
	cfg.NoListen, cfg.Retention.Disabled, cfg.Observer = true, true, stats
	w, err := pgrelay.NewInboxWorker(cfg)
	require.NoError(t, err)

	for round, n := range []int{1, 3, 1, 20, 7} {
		msgs := make([]pgrelay.Incoming, n)
		for i := range msgs {
			id := fmt.Sprintf("o-%d-%d", round, i)
			msgs[i] = pgrelay.Incoming{Message: orderCreatedMessage("created-"+id, id)}
		}
		receive(t, pool, msgs...)
		trips.Reset()
		before := stats.Snapshot().Processed
		require.NoError(t, pgrelay.RunOnce(ctx, w))
		got, inHandler := trips.Reset()
		// What follows the commit (waking the events deferred on the
		// orders the handler released) is not the batch's.
		end := slices.IndexFunc(got, func(s string) bool { return s == "batch" || s == "commit" })
		require.GreaterOrEqual(t, end, 0, "round %d: no commit in %q", round, got)
		got = got[:end+1]
		require.Equal(t, n, stats.Snapshot().Processed-before, "round %d: not processed", round)
		require.Positive(t, inHandler, "round %d: the handler ran no statement", round)
		t.Logf("round %d, %d events: %d round trips, %d of them the handler's: %q", round, n, len(got), inHandler, got)
		require.Equal(t, []string{"-- name: ClaimInbox :many", "begin"}, got[:2], "round %d", round)
		require.Equal(t, "batch", got[len(got)-1], "round %d: the mark and the commit go together", round)
		require.Equal(t, 3, len(got)-inHandler,
			"round %d: the claim, BEGIN and the mark with COMMIT besides the handler's statements, got %q", round, got)
	}
	require.Zero(t, queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox WHERE status <> 'processed'`))
}

// fencedBatchHandler writes an effect per event, without a unique key, and
// during the first batch it runs takes one of its events over as another
// worker would (a new claim: lock_version bumped, committed).
type fencedBatchHandler struct {
	pool    *pgxpool.Pool
	victim  string
	stolen  atomic.Bool
	batches atomic.Int32
}

func (h *fencedBatchHandler) Handle(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
	return h.HandleBatch(ctx, tx, []*pgrelay.InboxEvent{ev})
}

func (h *fencedBatchHandler) HandleBatch(ctx context.Context, tx pgx.Tx, evs []*pgrelay.InboxEvent) error {
	h.batches.Add(1)
	for _, ev := range evs {
		if _, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1)`, ev.EventID); err != nil {
			return err
		}
	}
	if len(evs) > 1 && h.stolen.CompareAndSwap(false, true) {
		_, err := h.pool.Exec(ctx, `UPDATE pgrelay.inbox SET lock_version = lock_version + 1, locked_by = 'B'
			WHERE event_id = $1 AND status = 'processing'`, h.victim)
		return err
	}
	return nil
}

// receiveWithEffects creates the effects table the handlers write to and
// stores n events, e0 to e(n-1), of one key.
func receiveWithEffects(ctx context.Context, t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	_, err := pool.Exec(ctx, `CREATE TABLE effects (event_id text NOT NULL)`)
	require.NoError(t, err)
	msgs := make([]pgrelay.Incoming, n)
	for i := range msgs {
		msgs[i] = pgrelay.Incoming{Message: pgrelay.Message{EventID: fmt.Sprintf("e%d", i), Topic: "t", Key: "k",
			EventType: "x", Payload: []byte(`{}`), OccurredAt: time.Now()}}
	}
	receive(t, pool, msgs...)
}

// TestTakenOverEventOfABatchNeverCommits (guarantee 6): an event of a batch
// taken over by another worker while the batch runs has no effect committed
// by this worker, and the batch's other events are processed, each effect
// once. Without the mark's check of how many rows it matched, the COMMIT
// sent with it commits the taken-over event's effect.
func TestTakenOverEventOfABatchNeverCommits(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	receiveWithEffects(ctx, t, pool, 5)

	h := &fencedBatchHandler{pool: pool, victim: "e2"}
	stats := &inboxtest.CountingObserver{}
	cfg := fastConfig(t, pool, h)
	cfg.NoListen, cfg.Retention.Disabled, cfg.Observer = true, true, stats
	w, err := pgrelay.NewInboxWorker(cfg)
	require.NoError(t, err)
	require.NoError(t, pgrelay.RunOnce(ctx, w))

	require.True(t, h.stolen.Load(), "the batch handler never ran")
	rows, err := pool.Query(ctx, `SELECT event_id FROM effects ORDER BY event_id`)
	require.NoError(t, err)
	effects, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"e0", "e1", "e3", "e4"}, effects, "the taken-over event's effect must not commit; the others' once")
	for _, id := range []string{"e0", "e1", "e3", "e4"} {
		require.Equal(t, "processed", inboxRow(t, pool, id).Status, id)
	}
	require.Equal(t, "processing", inboxRow(t, pool, "e2").Status, "e2 belongs to the other worker")
	s := stats.Snapshot()
	require.Equal(t, 4, s.Processed)
	require.Equal(t, 1, s.Fenced)
}

// TestMarkInboxBatchProcessedAllFailsOnlyOnMismatch: the mark sent with the
// COMMIT raises its error at run time when it matches fewer rows than it was
// given, and never when it matches them all: batches of 1 and 100, under
// custom and generic plans (with the parameters as constants the planner
// folds what it can), and on a statement prepared and run many times. Sent
// in one pgx batch with COMMIT, the failing mark leaves the transaction
// aborted and nothing committed.
func TestMarkInboxBatchProcessedAllFailsOnlyOnMismatch(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := pool.Exec(ctx, `INSERT INTO pgrelay.inbox (event_id, topic, status, lock_version)
		SELECT 'e-' || g, 'orders', 'processing', 1 FROM generate_series(1, 100) AS g`)
	require.NoError(t, err)
	keys := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("e-%d", i+1)
		}
		return out
	}
	versions := func(n int, wrong int) []int64 {
		out := make([]int64, n)
		for i := range out {
			out[i] = 1
		}
		if wrong >= 0 {
			out[wrong] = 2
		}
		return out
	}
	q := db.New()
	for _, planMode := range []string{"auto", "force_custom_plan", "force_generic_plan"} {
		for _, n := range []int{1, 100} {
			for run := range 7 { // a prepared statement may go generic after 5 runs
				func() {
					tx, err := pool.Begin(ctx)
					require.NoError(t, err)
					defer func() { _ = tx.Rollback(ctx) }()
					_, err = tx.Exec(ctx, `SELECT set_config('plan_cache_mode', $1, true)`, planMode)
					require.NoError(t, err)
					err = q.MarkInboxBatchProcessedAll(ctx, tx, db.MarkInboxBatchProcessedAllParams{
						Handler: "default", DedupKeys: keys(n), LockVersions: versions(n, -1)})
					require.NoError(t, err, "%s, %d rows, run %d: all match", planMode, n, run)
					var marked int
					require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM pgrelay.inbox WHERE status = 'processed'`).Scan(&marked))
					require.Equal(t, n, marked)

					_, err = tx.Exec(ctx, `SAVEPOINT s`)
					require.NoError(t, err)
					err = q.MarkInboxBatchProcessedAll(ctx, tx, db.MarkInboxBatchProcessedAllParams{
						Handler: "default", DedupKeys: keys(n), LockVersions: versions(n, n/2)})
					var pgErr *pgconn.PgError
					require.True(t, errors.As(err, &pgErr), "%s, %d rows, run %d: one taken over: %v", planMode, n, run, err)
					require.Equal(t, "22P02", pgErr.Code)
					require.Contains(t, pgErr.Message, fmt.Sprintf("matched 0 of %d", n)) // the rows are processed already
				}()
			}
		}
	}

	// In one batch with COMMIT, as the worker sends them: a mismatch
	// commits nothing.
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, "begin")
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `INSERT INTO pgrelay.inbox (event_id, topic, status) VALUES ('effect', 'orders', 'pending')`)
	require.NoError(t, err)
	err = q.MarkInboxBatchProcessedAll(ctx, commitAfter{conn.Conn()}, db.MarkInboxBatchProcessedAllParams{
		Handler: "default", DedupKeys: []string{"e-1", "e-2"}, LockVersions: []int64{1, 2}})
	require.Error(t, err)
	require.Equal(t, byte('E'), conn.Conn().PgConn().TxStatus(), "the COMMIT after the failed mark must not have run")
	_, err = conn.Exec(ctx, "rollback")
	require.NoError(t, err)
	require.Zero(t, queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox WHERE event_id = 'effect'`))
	require.Equal(t, "processing", inboxRow(t, pool, "e-1").Status)

	// Every row matching: the batch commits.
	_, err = conn.Exec(ctx, "begin")
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `INSERT INTO pgrelay.inbox (event_id, topic, status) VALUES ('effect', 'orders', 'pending')`)
	require.NoError(t, err)
	err = q.MarkInboxBatchProcessedAll(ctx, commitAfter{conn.Conn()}, db.MarkInboxBatchProcessedAllParams{
		Handler: "default", DedupKeys: []string{"e-1", "e-2"}, LockVersions: []int64{1, 1}})
	require.NoError(t, err)
	require.Equal(t, byte('I'), conn.Conn().PgConn().TxStatus())
	require.Equal(t, 1, queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox WHERE event_id = 'effect'`))
	require.Equal(t, "processed", inboxRow(t, pool, "e-2").Status)
}

// commitAfter sends a statement and COMMIT in one pgx batch, as the worker
// does.
type commitAfter struct{ conn *pgx.Conn }

func (c commitAfter) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	b.Queue("commit")
	return pgconn.CommandTag{}, c.conn.SendBatch(ctx, b).Close()
}

func (c commitAfter) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return nil, errors.New("not used")
}

func (c commitAfter) QueryRow(context.Context, string, ...any) pgx.Row { return nil }

// TestSwallowedErrorInOptimisticBatch: a handler that swallows the error of
// a statement that aborted the batch transaction sends the batch to the
// isolated run, where only its own event fails; the mark is not sent on the
// aborted transaction (nor would it commit anything there).
func TestSwallowedErrorInOptimisticBatch(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	receiveWithEffects(ctx, t, pool, 3)
	h := pgrelay.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
		if ev.EventID == "e1" {
			_, _ = tx.Exec(ctx, `SELECT 1/0`) // swallowed
			return nil
		}
		_, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1)`, ev.EventID)
		return err
	})
	stats := &inboxtest.CountingObserver{}
	cfg := fastConfig(t, pool, h)
	cfg.NoListen, cfg.Retention.Disabled, cfg.Observer = true, true, stats
	w, err := pgrelay.NewInboxWorker(cfg)
	require.NoError(t, err)
	require.NoError(t, pgrelay.RunOnce(ctx, w))
	rows, err := pool.Query(ctx, `SELECT event_id FROM effects ORDER BY event_id`)
	require.NoError(t, err)
	effects, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"e0", "e2"}, effects)
	require.Equal(t, "processed", inboxRow(t, pool, "e0").Status)
	require.Equal(t, "processed", inboxRow(t, pool, "e2").Status)
	require.Equal(t, "pending", inboxRow(t, pool, "e1").Status)
	s := stats.Snapshot()
	require.Equal(t, 2, s.Processed)
	require.Equal(t, 1, s.Retried)
}
