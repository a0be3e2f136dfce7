package migrations_test

import (
	"context"
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/migrations"
)

// provider opens a goose provider on url; force sets pgrelay.force_down.
func provider(t *testing.T, url string, force bool) (*pgxpool.Pool, func(context.Context) (int64, error), *providerOps) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	if force {
		cfg.ConnConfig.RuntimeParams["pgrelay.force_down"] = "on"
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	sqlDB := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = sqlDB.Close() })
	p, err := migrations.NewProvider(sqlDB)
	require.NoError(t, err)
	return pool, p.GetDBVersion, &providerOps{down: func(ctx context.Context) (string, error) {
		r, err := p.Down(ctx)
		if r != nil && r.Source != nil {
			return r.Source.Path, err
		}
		return "", err
	}, up: func(ctx context.Context) error { _, err := p.Up(ctx); return err }}
}

type providerOps struct {
	down func(context.Context) (string, error)
	up   func(context.Context) error
}

// TestConcurrentUpIsQuick: four instances migrating an empty database at once
// all succeed, each migration is applied once, and the ones that lost the
// race go on as soon as the winner is done. goose's own locker polls the
// lock every 5 seconds, so this took 5 to 10 seconds.
func TestConcurrentUpIsQuick(t *testing.T) {
	t.Parallel()
	url := testdb.EmptyURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const instances = 4
	ups := make([]*providerOps, instances)
	var version func(context.Context) (int64, error)
	for i := range ups {
		_, version, ups[i] = provider(t, url, false)
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, instances)
	done := make([]time.Duration, instances)
	for i := range ups {
		wg.Go(func() {
			errs[i] = ups[i].up(ctx)
			done[i] = time.Since(start)
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	v, err := version(ctx)
	require.NoError(t, err)
	require.EqualValues(t, latest(t), v)
	// The first to finish applied the migrations; the others waited for
	// the lock. Measured from the winner's end rather than as a total, so
	// that a loaded machine's slower migrations do not count: with goose's
	// 5-second poll the waiters finished seconds after the winner.
	first, last := slices.Min(done), slices.Max(done)
	t.Logf("%d concurrent migrate up: first done after %s, last after %s", instances, first, last)
	require.Less(t, last-first, 2500*time.Millisecond, "instances waiting for the migration lock must go on when it is released")
}

// latest is the highest migration version among the embedded files.
func latest(t *testing.T) int64 {
	t.Helper()
	names, err := fs.Glob(migrations.FS, "*.sql")
	require.NoError(t, err)
	var highest int64
	for _, n := range names {
		v, err := strconv.ParseInt(strings.SplitN(n, "_", 2)[0], 10, 64)
		require.NoError(t, err, n)
		highest = max(highest, v)
	}
	return highest
}

// TestDownRefusesToDropData: rolling back a migration whose table holds data
// fails, names the migration and the override, and changes nothing; emptied,
// or with pgrelay.force_down=on, it goes ahead.
func TestDownRefusesToDropData(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pool, version, ops := provider(t, url, false)
	exec := func(sql string) {
		t.Helper()
		_, err := pool.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	exec(`INSERT INTO pgrelay.replay_audit (source, action, event_id, actor) VALUES ('inbox', 'purge', 'e1', 'alice')`)
	exec(`INSERT INTO pgrelay.outbox (topic, key) VALUES ('orders', 'o1')`)
	exec(`INSERT INTO pgrelay.inbox (event_id, topic) VALUES ('e3', 'orders')`)
	exec(`INSERT INTO pgrelay.inbox_key_state (handler, key, last_applied, absorbed_seqs) VALUES ('default', 'o1', 3, '{5}')`)

	// Each guarded table, the statement that empties it, in rollback order.
	guarded := []struct{ migration, empty string }{
		{"00092_inbox_absorbed_seqs.sql", `UPDATE pgrelay.inbox_key_state SET absorbed_seqs = '{}'`},
		{"00086_inbox_ordered.sql", `DELETE FROM pgrelay.inbox_key_state`},
		{"00085_outbox_key_seqs.sql", `DELETE FROM pgrelay.outbox_key_seqs; UPDATE pgrelay.outbox SET key_seq = NULL`}, // o1's sequence
		{"00010_replay_audit.sql", `DELETE FROM pgrelay.replay_audit`},
		{"00003_outbox.sql", `UPDATE pgrelay.outbox SET status = 'published'`}, // published rows may go
		{"00001_inbox.sql", `DELETE FROM pgrelay.inbox`},
	}
	var refused []string
	for steps := 0; steps < 50; steps++ {
		v, err := version(ctx)
		require.NoError(t, err)
		if v == 0 {
			break
		}
		_, err = ops.down(ctx)
		if err == nil {
			continue
		}
		g := guarded[len(refused)]
		require.ErrorContains(t, err, "migrate down: "+g.migration[:len(g.migration)-4]+" would drop data")
		require.ErrorContains(t, err, "pgrelay.force_down=on")
		after, verr := version(ctx)
		require.NoError(t, verr)
		require.Equal(t, v, after, "a refused rollback changes nothing")
		refused = append(refused, g.migration)
		exec(g.empty)
	}
	require.Len(t, refused, len(guarded))

	// Forced: everything goes, data and all.
	url = testdb.NewURL(t)
	plain, _, _ := provider(t, url, false)
	_, err := plain.Exec(ctx, `INSERT INTO pgrelay.inbox (event_id, topic) VALUES ('e3', 'orders')`)
	require.NoError(t, err)
	_, version, ops = provider(t, url, true)
	for {
		v, err := version(ctx)
		require.NoError(t, err)
		if v == 0 {
			break
		}
		_, err = ops.down(ctx)
		require.NoError(t, err)
	}
}

// TestOccurredAtRangeMigration: migrating a database that holds outbox rows
// outside the occurred_at range marks the pending ones dead with the reason
// (no consumer could take them), leaves published ones alone, and from then
// on refuses such rows.
func TestOccurredAtRangeMigration(t *testing.T) {
	t.Parallel()
	url := testdb.EmptyURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Before version 100 the functions' bodies name pgrelay's objects
	// without a schema.
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["search_path"] = "pgrelay, public"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()
	p, err := migrations.NewProvider(sqlDB)
	require.NoError(t, err)
	_, err = p.UpTo(ctx, 44)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO pgrelay.outbox (event_id, topic, occurred_at) VALUES
		('late', 't', '10000-01-01 00:00:00+00'), ('zero', 't', '0001-01-01 00:00:00+00'), ('fine', 't', now())`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO pgrelay.outbox (event_id, topic, occurred_at) VALUES ('old-published', 't', '10000-01-01 00:00:00+00')`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE pgrelay.outbox SET status = 'published' WHERE event_id = 'old-published'`)
	require.NoError(t, err)

	_, err = p.UpTo(ctx, 45)
	require.NoError(t, err)
	status := func(id string) (string, string) {
		var s, e string
		require.NoError(t, pool.QueryRow(ctx, `SELECT status, coalesce(last_error, '') FROM pgrelay.outbox WHERE event_id = $1`, id).Scan(&s, &e))
		return s, e
	}
	for _, id := range []string{"late", "zero"} {
		s, e := status(id)
		require.Equal(t, "dead", s, id)
		require.Contains(t, e, "is out of range", id)
	}
	s, _ := status("fine")
	require.Equal(t, "pending", s)
	s, _ = status("old-published")
	require.Equal(t, "published", s)
	_, err = pool.Exec(ctx, `INSERT INTO pgrelay.outbox (topic, occurred_at) VALUES ('t', '10000-01-01 00:00:00+00')`)
	require.ErrorContains(t, err, "outbox_occurred_at_range")
}
