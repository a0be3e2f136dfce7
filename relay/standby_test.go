package relay

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/testcluster"
)

// TestStandbyNamesNeedsTheStatsRole: with StandbyNames, a role that cannot
// see pg_stat_replication's LSN columns (it would wait for ever) is refused
// at start-up, naming the setting and the grant; granted pg_monitor, it
// passes.
func TestStandbyNamesNeedsTheStatsRole(t *testing.T) {
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	role := fmt.Sprintf("standby_waiter_%d", time.Now().UnixNano())
	_, err := b.pool.Exec(ctx, `CREATE ROLE `+role+` LOGIN`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = b.pool.Exec(context.Background(), `DROP ROLE `+role) })
	pool, err := pgxpool.New(ctx, strings.Replace(b.dbURL, "postgres@", role+"@", 1))
	require.NoError(t, err)
	defer pool.Close()

	cfg := b.testConfig(t, b.publisher(t), nil)
	cfg.Pool, cfg.StandbyNames = pool, []string{"standby"}
	r, err := newEngine(cfg)
	require.NoError(t, err)
	err = r.run(ctx)
	require.ErrorContains(t, err, "StandbyNames: the database role cannot see the standbys' positions in pg_stat_replication")
	require.ErrorContains(t, err, "GRANT pg_monitor (or pg_read_all_stats)")

	_, err = b.pool.Exec(ctx, `GRANT pg_monitor TO `+role)
	require.NoError(t, err)
	require.NoError(t, r.checkStandbys(ctx))
}

// TestStandbyWaitFigures measures what StandbyNames costs (docs/relay.md):
// a private primary with a streaming standby on loopback, 100 one-event
// transactions a second over random keys for 5 s per round, rounds with and
// without StandbyNames alternating (off, on, off, on); per round, commit
// (created_at) → published (published_at) p50, p99 and max, with the load
// average. Run with PGRELAY_STANDBY_FIGURES=1.
func TestStandbyWaitFigures(t *testing.T) {
	if os.Getenv("PGRELAY_STANDBY_FIGURES") == "" {
		t.Skip("figures: set PGRELAY_STANDBY_FIGURES=1")
	}
	const rate, round = 100, 5 * time.Second
	pair := testcluster.StartPair(t, "")
	b := setup(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pair.Primary.URL())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	b.pool, b.dbURL = pool, pair.Primary.URL()
	pub := b.publisher(t)
	for r, names := range [][]string{nil, {"standby"}, nil, {"standby"}} {
		cfg := b.testConfig(t, pub, nil)
		cfg.Lease, cfg.HeartbeatInterval, cfg.PollInterval, cfg.StandbyNames = DefaultLease, DefaultLease/3, time.Second, names
		_, stop := start(t, cfg)
		tick := time.NewTicker(time.Second / rate)
		for i, end := 0, time.Now().Add(round); time.Now().Before(end); i++ {
			<-tick.C
			b.enqueue(t, pgrelay.Message{EventID: fmt.Sprintf("r%d-%d", r, i), Topic: "orders", Key: fmt.Sprintf("key-%d", i%997),
				EventType: "OrderCreated", Payload: []byte("1")})
		}
		tick.Stop()
		require.Eventually(t, func() bool { return b.count(t, "pending") == 0 }, time.Minute, 20*time.Millisecond)
		stop()
		var n int
		var p50, p99, maxMs float64
		require.NoError(t, pool.QueryRow(ctx, `
			SELECT count(*)::int,
			       percentile_cont(0.5) WITHIN GROUP (ORDER BY d), percentile_cont(0.99) WITHIN GROUP (ORDER BY d), max(d)
			FROM (SELECT extract(epoch FROM published_at - created_at) * 1000 AS d FROM pgrelay.outbox WHERE event_id LIKE $1) s`,
			fmt.Sprintf("r%d-%%", r)).Scan(&n, &p50, &p99, &maxMs))
		t.Logf("FIGURES standby names %v: %d events, commit → published p50 %.1f ms, p99 %.1f ms, max %.1f ms; load %s",
			names, n, p50, p99, maxMs, loadAvg())
	}
}

// TestStandbyWaitOnAQuietServer: with StandbyNames on a server where nothing
// else commits, each event is published within a second of its commit. The
// WAL position a batch waits for can lie on a page the WAL writer leaves
// unflushed until some transaction commits (here a transaction that writes
// a row every 100 ms and never commits; page pruning by readers does the
// same); the relay then commits one itself instead of waiting for the next
// heartbeat (a third of the lease, here 5 s).
func TestStandbyWaitOnAQuietServer(t *testing.T) {
	pair := testcluster.StartPair(t, "")
	b := setup(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pair.Primary.URL())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	b.pool, b.dbURL = pool, pair.Primary.URL()
	cfg := b.testConfig(t, b.publisher(t), nil)
	cfg.Lease, cfg.HeartbeatInterval, cfg.PollInterval, cfg.StandbyNames = DefaultLease, DefaultLease/3, 100*time.Millisecond, []string{"standby"}
	writer, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer writer.Release()
	_, err = writer.Exec(ctx, `CREATE TABLE scratch (n int); BEGIN`)
	require.NoError(t, err)
	wctx, stopWriting := context.WithCancel(ctx)
	written := make(chan struct{})
	go func() {
		defer close(written)
		for wctx.Err() == nil {
			if _, err := writer.Exec(wctx, `INSERT INTO scratch VALUES (1)`); err != nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	defer func() { stopWriting(); <-written; _, _ = writer.Exec(ctx, `ROLLBACK`) }()

	_, stop := start(t, cfg)
	defer stop()
	for i := range 5 {
		id := fmt.Sprintf("quiet-%d", i)
		b.enqueue(t, pgrelay.Message{EventID: id, Topic: "orders", Key: "k", EventType: "OrderCreated", Payload: []byte("1")})
		require.Eventually(t, func() bool { return b.count(t, "pending") == 0 }, time.Minute, 10*time.Millisecond)
		var waited float64
		require.NoError(t, pool.QueryRow(ctx, `SELECT extract(epoch FROM published_at - created_at) FROM pgrelay.outbox WHERE event_id = $1`, id).Scan(&waited))
		require.Less(t, waited, 1.0, "event %s published %.2f s after its commit", id, waited)
		time.Sleep(300 * time.Millisecond)
	}
}
