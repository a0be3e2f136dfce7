package pgrelay

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/testdb"
)

const day = 24 * time.Hour

// seed inserts inbox rows: id -> (status, age of finished_at or received_at).
func seedInbox(t *testing.T, pool *pgxpool.Pool, rows map[string]struct {
	status string
	age    time.Duration
}) {
	t.Helper()
	for id, r := range rows {
		at := time.Now().Add(-r.age)
		var finished *time.Time
		if r.status == "processed" || r.status == "dead" {
			finished = &at
		}
		_, err := pool.Exec(context.Background(), `INSERT INTO pgrelay.inbox (event_id, status, received_at, finished_at)
			VALUES ($1, $2, $3, $4)`, id, r.status, at, finished)
		require.NoError(t, err)
	}
}

func remainingInbox(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT event_id FROM pgrelay.inbox`)
	require.NoError(t, err)
	var ids []string
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		ids = append(ids, id)
	}
	require.NoError(t, rows.Err())
	sort.Strings(ids)
	return ids
}

type inboxRow = struct {
	status string
	age    time.Duration
}

// TestDeletesOnlyRowsPastTheWindow: processed rows older than the window go,
// in several batches; younger processed rows, and pending, processing and
// dead rows of any age, stay.
func TestDeletesOnlyRowsPastTheWindow(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	seedInbox(t, pool, map[string]inboxRow{
		"old-1": {"processed", 8 * day}, "old-2": {"processed", 9 * day}, "old-3": {"processed", 30 * day},
		"old-4": {"processed", 7*day + time.Hour}, "old-5": {"processed", 100 * day},
		"young":      {"processed", 7*day - time.Hour},
		"dead-old":   {"dead", 60 * day},
		"pending":    {"pending", 60 * day},
		"processing": {"processing", 60 * day},
	})
	c, err := NewInboxCleaner(pool, InboxRetentionConfig{BatchSize: 2, Pause: time.Millisecond}, nil)
	require.NoError(t, err)
	n, err := c.RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, int64(5), n)
	require.Equal(t, []string{"dead-old", "pending", "processing", "young"}, remainingInbox(t, pool))

	n, err = c.RunOnce(context.Background())
	require.NoError(t, err)
	require.Zero(t, n)
}

// TestNeverWaitsOnLockedRows: a inboxRow held by another transaction is skipped,
// not waited for; the rest of the batch is deleted.
func TestNeverWaitsOnLockedRows(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	seedInbox(t, pool, map[string]inboxRow{"held": {"processed", 8 * day}, "free": {"processed", 8 * day}})
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, `SELECT 1 FROM pgrelay.inbox WHERE event_id = 'held' FOR UPDATE`)
	require.NoError(t, err)

	c, err := NewInboxCleaner(pool, InboxRetentionConfig{QueryTimeout: 3 * time.Second}, nil)
	require.NoError(t, err)
	start := time.Now()
	n, err := c.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	require.Less(t, time.Since(start), 2*time.Second)
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, []string{"held"}, remainingInbox(t, pool))
}

type deletedObserver struct{ deleted chan int64 }

func (o deletedObserver) Deleted(n int64) { o.deleted <- n }
func (o deletedObserver) Failed(error)    {}

// TestRunLoopsUntilCancelled: Run deletes on its schedule and returns nil on
// cancel.
func TestRunLoopsUntilCancelled(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	seedInbox(t, pool, map[string]inboxRow{"old": {"processed", 8 * day}})
	obs := deletedObserver{deleted: make(chan int64, 100)}
	c, err := NewInboxCleaner(pool, InboxRetentionConfig{Interval: 10 * time.Millisecond, Observer: obs}, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	require.Equal(t, int64(1), <-obs.deleted)
	require.Equal(t, int64(0), <-obs.deleted, "a second run finds nothing")
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
	}
	require.Empty(t, remainingInbox(t, pool))
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	pool := &pgxpool.Pool{}
	_, err := NewInboxCleaner(nil, InboxRetentionConfig{}, nil)
	require.ErrorContains(t, err, "the pool is required")
	_, err = NewInboxCleaner(pool, InboxRetentionConfig{Window: time.Second}, nil)
	require.ErrorContains(t, err, "InboxConfig.Retention.Window")
	_, err = NewInboxCleaner(pool, InboxRetentionConfig{BatchSize: -1}, nil)
	require.ErrorContains(t, err, "InboxConfig.Retention.BatchSize")
	_, err = NewInboxCleaner(pool, InboxRetentionConfig{Interval: -time.Second}, nil)
	require.ErrorContains(t, err, "InboxConfig.Retention.Interval")
	c, err := NewInboxCleaner(pool, InboxRetentionConfig{}, nil)
	require.NoError(t, err)
	require.Equal(t, DefaultDedupWindow, c.cfg.Window)
}

// TestMinimumWindowCoversTheDuplicateWindow: a dedup window shorter than an
// hour is refused, JetStream's default duplicate window (2 minutes) among
// them: a republish the broker no longer recognises would be applied again.
func TestMinimumWindowCoversTheDuplicateWindow(t *testing.T) {
	t.Parallel()
	pool := &pgxpool.Pool{}
	for _, w := range []time.Duration{time.Minute, 2 * time.Minute, 59 * time.Minute} {
		_, err := NewInboxCleaner(pool, InboxRetentionConfig{Window: w}, nil)
		require.ErrorContains(t, err, "must be at least 1h0m0s", "window %s", w)
	}
	_, err := NewInboxCleaner(pool, InboxRetentionConfig{Window: time.Hour}, nil)
	require.NoError(t, err)
}

// TestDeletesExpiredReleaseRecords: dependency release records older than the
// release horizon go, however much longer the dedup window is; younger ones
// stay. The horizon is the only one: the worker runs no other pruning.
func TestDeletesExpiredReleaseRecords(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO pgrelay.inbox_releases (waiting_for, released_at) VALUES
		('order:old-1', now() - interval '11 minutes'), ('order:old-2', now() - interval '30 days'),
		('order:old-3', now() - interval '2 hours'), ('order:young', now() - interval '1 minute')`)
	require.NoError(t, err)
	c, err := NewInboxCleaner(pool, InboxRetentionConfig{BatchSize: 2, Pause: time.Millisecond}, nil)
	require.NoError(t, err)
	require.Equal(t, 10*time.Minute, c.cfg.ReleaseHorizon, "the default horizon: ten default leases, at least 10m")
	_, err = c.RunOnce(ctx)
	require.NoError(t, err)
	var left []string
	rows, err := pool.Query(ctx, `SELECT waiting_for FROM pgrelay.inbox_releases ORDER BY 1`)
	require.NoError(t, err)
	for rows.Next() {
		var w string
		require.NoError(t, rows.Scan(&w))
		left = append(left, w)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"order:young"}, left)
}

// TestWorkerDerivesTheReleaseHorizonFromItsLease: a worker's upkeep keeps
// Release records for ten of its leases, and at least ten minutes.
func TestWorkerDerivesTheReleaseHorizonFromItsLease(t *testing.T) {
	t.Parallel()
	pool := &pgxpool.Pool{}
	for lease, want := range map[time.Duration]time.Duration{time.Second: 10 * time.Minute, 2 * time.Minute: 20 * time.Minute} {
		cfg := InboxConfig{Pool: pool, Lease: lease, HandlerTimeout: lease / 2}.withDefaults()
		require.Equal(t, want, cfg.Retention.ReleaseHorizon, "lease %s", lease)
	}
	cfg := InboxConfig{Pool: pool, Retention: InboxRetentionConfig{ReleaseHorizon: time.Hour}}.withDefaults()
	require.Equal(t, time.Hour, cfg.Retention.ReleaseHorizon, "a horizon set is kept")
}

// TestPrunesTheDuplicateRecord: a run keeps only the newest DuplicatesMax
// recorded duplicates, deleting the older ones over several batches, and
// deletes receive counts older than a day.
func TestPrunesTheDuplicateRecord(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO pgrelay.inbox_duplicates (event_id) SELECT 'd' || g FROM generate_series(1, 25) AS g`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO pgrelay.inbox_receive_counts (minute, backend, received, duplicates)
		VALUES (date_trunc('minute', now()), 1, 10, 1), (now() - interval '26 hours', 1, 10, 1), (now() - interval '2 days', 2, 5, 5)`)
	require.NoError(t, err)
	c, err := NewInboxCleaner(pool, InboxRetentionConfig{BatchSize: 4, Pause: time.Millisecond, DuplicatesMax: 7}, nil)
	require.NoError(t, err)
	_, err = c.RunOnce(ctx)
	require.NoError(t, err)
	var n, lowest int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), min(substr(event_id, 2)::int) FROM pgrelay.inbox_duplicates`).Scan(&n, &lowest))
	require.Equal(t, 7, n)
	require.Equal(t, 19, lowest, "the newest are kept")
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pgrelay.inbox_receive_counts`).Scan(&n))
	require.Equal(t, 1, n)
}

// TestDeletesExpiredConflicts: recorded key conflicts older than the window
// go, in batches; younger ones stay.
func TestDeletesExpiredConflicts(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO pgrelay.inbox_conflicts (handler, dedup_key, key_strategy, stored_event_id, event_id,
		stored_fingerprint, fingerprint, detected_at)
		SELECT 'h', 'k' || i, 'message-id', 'a', 'b', '\x01', '\x02', now() - make_interval(days => i)
		FROM generate_series(1, 10) AS i`)
	require.NoError(t, err)
	c, err := NewInboxCleaner(pool, InboxRetentionConfig{BatchSize: 2, Pause: time.Millisecond}, nil)
	require.NoError(t, err)
	_, err = c.RunOnce(ctx)
	require.NoError(t, err)
	var left int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pgrelay.inbox_conflicts`).Scan(&left))
	require.Equal(t, 6, left, "days 1 to 6 are inside the 7-day window")
}

// TestWorkerRetentionCanBeDisabled: Retention.Disabled builds a worker
// without upkeep, and skips the upkeep's settings checks; otherwise a bad
// setting fails NewInboxWorker naming InboxConfig.Retention's field.
func TestWorkerRetentionCanBeDisabled(t *testing.T) {
	t.Parallel()
	h := HandlerFunc(func(context.Context, pgx.Tx, *InboxEvent) error { return nil })
	pool := &pgxpool.Pool{}
	w, err := NewInboxWorker(InboxConfig{Pool: pool, Handler: h})
	require.NoError(t, err)
	require.NotNil(t, w.cleaner)
	w, err = NewInboxWorker(InboxConfig{Pool: pool, Handler: h, Retention: InboxRetentionConfig{Disabled: true, Window: time.Second}})
	require.NoError(t, err)
	require.Nil(t, w.cleaner)
	_, err = NewInboxWorker(InboxConfig{Pool: pool, Handler: h, Retention: InboxRetentionConfig{Window: time.Second}})
	require.ErrorContains(t, err, "inbox: InboxConfig.Retention.Window must be at least 1h0m0s, got 1s")
}
