package retention

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/testdb"
)

const day = 24 * time.Hour

// seed inserts inbox rows: id -> (status, age of finished_at or received_at).
func seed(t *testing.T, pool *pgxpool.Pool, rows map[string]struct {
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
		_, err := pool.Exec(context.Background(), `INSERT INTO inbox (event_id, status, received_at, finished_at)
			VALUES ($1, $2, $3, $4)`, id, r.status, at, finished)
		require.NoError(t, err)
	}
}

func remaining(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT event_id FROM inbox`)
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

type row = struct {
	status string
	age    time.Duration
}

// TestDeletesOnlyRowsPastTheWindow: processed rows older than the window go,
// in several batches; younger processed rows, and pending, processing and
// dead rows of any age, stay.
func TestDeletesOnlyRowsPastTheWindow(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	seed(t, pool, map[string]row{
		"old-1": {"processed", 8 * day}, "old-2": {"processed", 9 * day}, "old-3": {"processed", 30 * day},
		"old-4": {"processed", 7*day + time.Hour}, "old-5": {"processed", 100 * day},
		"young":      {"processed", 7*day - time.Hour},
		"dead-old":   {"dead", 60 * day},
		"pending":    {"pending", 60 * day},
		"processing": {"processing", 60 * day},
	})
	c, err := New(Config{Pool: pool, BatchSize: 2, Pause: time.Millisecond})
	require.NoError(t, err)
	n, err := c.RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, int64(5), n)
	require.Equal(t, []string{"dead-old", "pending", "processing", "young"}, remaining(t, pool))

	n, err = c.RunOnce(context.Background())
	require.NoError(t, err)
	require.Zero(t, n)
}

// TestNeverWaitsOnLockedRows: a row held by another transaction is skipped,
// not waited for; the rest of the batch is deleted.
func TestNeverWaitsOnLockedRows(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	seed(t, pool, map[string]row{"held": {"processed", 8 * day}, "free": {"processed", 8 * day}})
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, `SELECT 1 FROM inbox WHERE event_id = 'held' FOR UPDATE`)
	require.NoError(t, err)

	c, err := New(Config{Pool: pool, QueryTimeout: 3 * time.Second})
	require.NoError(t, err)
	start := time.Now()
	n, err := c.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	require.Less(t, time.Since(start), 2*time.Second)
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, []string{"held"}, remaining(t, pool))
}

type countingObserver struct{ deleted chan int64 }

func (o countingObserver) Deleted(n int64) { o.deleted <- n }
func (o countingObserver) Failed(error)    {}

// TestRunLoopsUntilCancelled: Run deletes on its schedule and returns nil on
// cancel.
func TestRunLoopsUntilCancelled(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	seed(t, pool, map[string]row{"old": {"processed", 8 * day}})
	obs := countingObserver{deleted: make(chan int64, 100)}
	c, err := New(Config{Pool: pool, Interval: 10 * time.Millisecond, Observer: obs})
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
	require.Empty(t, remaining(t, pool))
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	pool := &pgxpool.Pool{}
	_, err := New(Config{})
	require.ErrorContains(t, err, "Config.Pool")
	_, err = New(Config{Pool: pool, Window: time.Second})
	require.ErrorContains(t, err, "Config.Window")
	_, err = New(Config{Pool: pool, BatchSize: -1})
	require.ErrorContains(t, err, "Config.BatchSize")
	_, err = New(Config{Pool: pool, Interval: -time.Second})
	require.ErrorContains(t, err, "Config.Interval")
	c, err := New(Config{Pool: pool})
	require.NoError(t, err)
	require.Equal(t, DefaultWindow, c.cfg.Window)
}

// TestMinimumWindowCoversTheDuplicateWindow: a dedup window shorter than an
// hour is refused, JetStream's default duplicate window (2 minutes) among
// them: a republish the broker no longer recognises would be applied again.
func TestMinimumWindowCoversTheDuplicateWindow(t *testing.T) {
	t.Parallel()
	pool := &pgxpool.Pool{}
	for _, w := range []time.Duration{time.Minute, 2 * time.Minute, 59 * time.Minute} {
		_, err := New(Config{Pool: pool, Window: w})
		require.ErrorContains(t, err, "must be at least 1h0m0s", "window %s", w)
	}
	_, err := New(Config{Pool: pool, Window: time.Hour})
	require.NoError(t, err)
}

// TestDeletesExpiredReleaseRecords: dependency release records older than the
// window go; younger ones stay.
func TestDeletesExpiredReleaseRecords(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO inbox_releases (waiting_for, released_at) VALUES
		('order:old-1', now() - interval '8 days'), ('order:old-2', now() - interval '30 days'),
		('order:old-3', now() - interval '9 days'), ('order:young', now() - interval '6 days')`)
	require.NoError(t, err)
	c, err := New(Config{Pool: pool, BatchSize: 2, Pause: time.Millisecond})
	require.NoError(t, err)
	_, err = c.RunOnce(ctx)
	require.NoError(t, err)
	var left []string
	rows, err := pool.Query(ctx, `SELECT waiting_for FROM inbox_releases ORDER BY 1`)
	require.NoError(t, err)
	for rows.Next() {
		var w string
		require.NoError(t, rows.Scan(&w))
		left = append(left, w)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"order:young"}, left)
}

// TestPrunesTheDuplicateRecord: a run keeps only the newest DuplicatesMax
// recorded duplicates, deleting the older ones over several batches, and
// deletes receive counts older than a day.
func TestPrunesTheDuplicateRecord(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO inbox_duplicates (event_id) SELECT 'd' || g FROM generate_series(1, 25) AS g`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO inbox_receive_counts (minute, backend, received, duplicates)
		VALUES (date_trunc('minute', now()), 1, 10, 1), (now() - interval '26 hours', 1, 10, 1), (now() - interval '2 days', 2, 5, 5)`)
	require.NoError(t, err)
	c, err := New(Config{Pool: pool, BatchSize: 4, Pause: time.Millisecond, DuplicatesMax: 7})
	require.NoError(t, err)
	_, err = c.RunOnce(ctx)
	require.NoError(t, err)
	var n, lowest int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), min(substr(event_id, 2)::int) FROM inbox_duplicates`).Scan(&n, &lowest))
	require.Equal(t, 7, n)
	require.Equal(t, 19, lowest, "the newest are kept")
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM inbox_receive_counts`).Scan(&n))
	require.Equal(t, 1, n)
}

// TestDeletesExpiredConflicts: recorded key conflicts older than the window
// go, in batches; younger ones stay.
func TestDeletesExpiredConflicts(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO inbox_conflicts (handler, dedup_key, key_strategy, stored_event_id, event_id,
		stored_fingerprint, fingerprint, detected_at)
		SELECT 'h', 'k' || i, 'message-id', 'a', 'b', '\x01', '\x02', now() - make_interval(days => i)
		FROM generate_series(1, 10) AS i`)
	require.NoError(t, err)
	c, err := New(Config{Pool: pool, BatchSize: 2, Pause: time.Millisecond})
	require.NoError(t, err)
	_, err = c.RunOnce(ctx)
	require.NoError(t, err)
	var left int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM inbox_conflicts`).Scan(&left))
	require.Equal(t, 6, left, "days 1 to 6 are inside the 7-day window")
}
