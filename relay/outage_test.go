package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/db"
	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/internal/testnats"
)

// TestBrokerOutageBacklogDrainsInOrder covers guarantee 2 across a broker
// outage: the NATS server stops, a backlog builds (publishes fail, rows stay
// pending), a new server starts on the same port and store, and the backlog
// drains with nothing lost and every key in order.
func TestBrokerOutageBacklogDrainsInOrder(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	srv := testnats.Start(t, dir, -1)
	port := srv.Addr().(*net.TCPAddr).Port
	b := setupWithNATS(t, srv.ClientURL())
	obs := &countingObserver{}
	start(t, b.testConfig(t, b.publisher(t), obs))

	b.enqueue(t, msgs(10, "before", "pre")...)
	b.waitCount(t, "published", 10, 10*time.Second)

	srv.Shutdown()
	srv.WaitForShutdown()
	const keys, perKey = 5, 100
	for k := range keys {
		b.enqueue(t, msgs(perKey, fmt.Sprintf("during-%d", k), fmt.Sprintf("out-%d", k))...)
	}
	require.Eventually(t, func() bool { return obs.failed.Load() >= 2 }, 20*time.Second, 10*time.Millisecond, "publishing must fail while NATS is down")
	require.Equal(t, keys*perKey, b.count(t, "pending"), "the backlog is kept")
	require.Zero(t, b.count(t, "dead"), "an outage is not a permanent rejection")

	testnats.Start(t, dir, port)
	b.waitCount(t, "published", 10+keys*perKey, 60*time.Second)

	sub := b.subscribe(t)
	last := map[string]int{}
	for seen := 0; seen < 10+keys*perKey; seen++ {
		select {
		case r := <-sub:
			require.Equal(t, last[r.key]+1, r.seq, "key %s out of order at %s", r.key, r.eventID)
			last[r.key] = r.seq
		case <-time.After(10 * time.Second):
			t.Fatalf("only %d messages in the stream", seen)
		}
	}
	require.Equal(t, uint64(10+keys*perKey), b.streamMsgs(t), "nothing lost, nothing doubled")
}

func setupWithNATS(t *testing.T, natsURL string) *bundle {
	t.Helper()
	dbURL := testdb.NewURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	stream, prefix := testnats.Stream(t, natsURL)
	_, js := testnats.Connect(t, natsURL)
	return &bundle{pool: pool, dbURL: dbURL, natsURL: natsURL, stream: stream, prefix: prefix, js: js}
}

// TestMarkTouchesOnlyItsBatch: marking a batch looks up its rows by primary
// key, whatever the statistics say. With statistics taken while the outbox was
// empty, the mark matched the pending partial index on (partition, status)
// and read all of the partition's pending entries per batch (3,000 entries,
// 1,150 buffers besides the update's own for a mark of 100 at a 50,000-row
// backlog).
func TestMarkTouchesOnlyItsBatch(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("loads 40,000 rows")
	}
	pool := testdb.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var part int32
	require.NoError(t, pool.QueryRow(ctx, `SELECT pgrelay.outbox_partition('key-1')`).Scan(&part))
	for _, q := range []string{
		`ALTER TABLE pgrelay.outbox SET UNLOGGED`,
		`ALTER TABLE pgrelay.outbox SET (autovacuum_enabled = false)`,
		`ANALYZE pgrelay.outbox`, // empty: the statistics a fresh install has
		`INSERT INTO pgrelay.outbox (event_id, topic, key) SELECT 'e-' || g, 'orders', 'key-' || (g % 1000) FROM generate_series(1, 40000) AS g`,
	} {
		_, err := pool.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	_, err := pool.Exec(ctx, `UPDATE pgrelay.relay_partitions SET owner = 'me', epoch = 7, lease_until = now() + interval '1 minute' WHERE partition = $1`, part)
	require.NoError(t, err)
	var ids []int64
	rows, err := pool.Query(ctx, `SELECT id FROM pgrelay.outbox WHERE partition = $1 ORDER BY id LIMIT 100`, part)
	require.NoError(t, err)
	ids, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.Len(t, ids, 100)
	var pending int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pgrelay.outbox WHERE partition = $1`, part).Scan(&pending))

	explain := func(parts []int32, epochs, ids []int64) testdb.PlanNode {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		ex := &testdb.Explain{DBTX: tx}
		_, err = db.New().MarkOutcomesMany(ctx, ex, db.MarkOutcomesManyParams{
			Partitions: parts, Owner: "me", Epochs: epochs, Ids: ids, DeadIds: []int64{}, DeadReasons: []string{},
		})
		require.ErrorIs(t, err, testdb.ErrExplained)
		root := ex.Root(t)
		require.False(t, root.Uses("outbox_pending_idx"), "the mark must not scan the partitions' pending entries: %s", ex.JSON)
		require.True(t, root.Uses("outbox_pkey"), "the mark looks its rows up by primary key: %s", ex.JSON)
		require.Equal(t, []float64{1}, pkeyLoops(t, ex.JSON), "the rows are looked up once, not once per partition: %s", ex.JSON)
		return root
	}
	root := explain([]int32{part}, []int64{7}, ids)
	t.Logf("mark of 100 with %d pending in the partition: %d buffers", pending, root.SharedHit+root.SharedRead)

	// A combined mark of four partitions' batches (the marker's), as many
	// rows in all: by primary key too, in one scan (not one per partition).
	parts := []int32{part}
	for i := 2; len(parts) < 4; i++ {
		var p int32
		require.NoError(t, pool.QueryRow(ctx, `SELECT pgrelay.outbox_partition($1)`, fmt.Sprintf("key-%d", i)).Scan(&p))
		if !slices.Contains(parts, p) {
			parts = append(parts, p)
		}
	}
	_, err = pool.Exec(ctx, `UPDATE pgrelay.relay_partitions SET owner = 'me', epoch = 7, lease_until = now() + interval '1 minute' WHERE partition = ANY($1)`, parts)
	require.NoError(t, err)
	rows, err = pool.Query(ctx, `SELECT id FROM unnest($1::int[]) AS p
		CROSS JOIN LATERAL (SELECT id FROM pgrelay.outbox WHERE partition = p ORDER BY id LIMIT 25) AS b`, parts)
	require.NoError(t, err)
	all, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.Len(t, all, 100)
	root = explain(parts, []int64{7, 7, 7, 7}, all)
	t.Logf("combined mark of 4 × 25: %d buffers", root.SharedHit+root.SharedRead)
}

// pkeyLoops returns the loops of each scan of outbox_pkey in an EXPLAIN
// (FORMAT JSON) plan.
func pkeyLoops(t *testing.T, plan []byte) []float64 {
	var nodes []map[string]any
	require.NoError(t, json.Unmarshal(plan, &nodes))
	var loops []float64
	var walk func(n map[string]any)
	walk = func(n map[string]any) {
		if n["Index Name"] == "outbox_pkey" {
			l, _ := n["Actual Loops"].(float64)
			loops = append(loops, l)
		}
		children, _ := n["Plans"].([]any)
		for _, c := range children {
			if m, ok := c.(map[string]any); ok {
				walk(m)
			}
		}
	}
	for _, n := range nodes {
		if p, ok := n["Plan"].(map[string]any); ok {
			walk(p)
		}
	}
	return loops
}

// TestClaimIsOBatchOnLargeOutbox: with 1,000,000 published and dead rows
// and 1,000 pending, reading a batch uses the pending partial index and
// touches a bounded number of buffers.
func TestClaimIsOBatchOnLargeOutbox(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("loads a million rows")
	}
	pool := testdb.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	// Bulk load without the per-row trigger (session_replication_role), ids
	// and partitions as the trigger would set them; the trigger is back for
	// the pending rows.
	// The table is unlogged: durability is not under test, and WAL for a
	// million rows would dominate the test's time.
	for _, q := range []string{
		`ALTER TABLE pgrelay.outbox SET UNLOGGED`,
		`SET session_replication_role = replica`,
		`INSERT INTO pgrelay.outbox (id, event_id, topic, key, partition, status, published_at, last_error)
		 SELECT g, 'old-' || g, 'orders', 'key-' || (g % 1000), pgrelay.outbox_partition('key-' || (g % 1000)),
		        CASE WHEN g % 10 = 0 THEN 'dead' ELSE 'published' END,
		        CASE WHEN g % 10 = 0 THEN NULL ELSE now() END,
		        CASE WHEN g % 10 = 0 THEN 'rejected' END
		 FROM generate_series(1, 1000000) AS g`,
		`SELECT setval('pgrelay.outbox_id_seq', 1000000)`,
		`SET session_replication_role = DEFAULT`,
		`INSERT INTO pgrelay.outbox (topic, key) SELECT 'orders', 'key-' || g FROM generate_series(1, 1000) AS g`,
		`ANALYZE pgrelay.outbox`,
	} {
		_, err := conn.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	conn.Release()

	var part int32
	require.NoError(t, pool.QueryRow(ctx, `SELECT pgrelay.outbox_partition('key-1')`).Scan(&part))
	ex := &testdb.Explain{DBTX: pool}
	_, err = db.New().PendingBatch(ctx, ex, db.PendingBatchParams{Partition: part, BatchSize: 500, Exclude: []int64{}})
	require.ErrorIs(t, err, testdb.ErrExplained)
	root := ex.Root(t)
	buffers := root.SharedHit + root.SharedRead
	t.Logf("claim on 1,001,000 rows: %d rows returned, %d buffers", root.ActualRows, buffers)
	require.Positive(t, root.ActualRows)
	require.True(t, root.Uses("outbox_pending_idx"), "the claim must use the pending partial index: %s", ex.JSON)
	require.LessOrEqual(t, buffers, 100, "a claim must touch O(batch) buffers: %s", ex.JSON)

	// The busy poll's read runs the same query per partition.
	ex = &testdb.Explain{DBTX: pool}
	_, err = db.New().PendingBatchMany(ctx, ex, db.PendingBatchManyParams{Partitions: []int32{part}, Afters: []int64{0}, BatchSize: 500})
	require.ErrorIs(t, err, testdb.ErrExplained)
	root = ex.Root(t)
	buffers = root.SharedHit + root.SharedRead
	t.Logf("busy poll on 1,001,000 rows: %d rows returned, %d buffers", root.ActualRows, buffers)
	require.Positive(t, root.ActualRows)
	require.True(t, root.Uses("outbox_pending_idx"), "the busy poll must use the pending partial index: %s", ex.JSON)
	require.LessOrEqual(t, buffers, 100, "a busy poll must touch O(batch) buffers: %s", ex.JSON)
}

// TestDatabaseConnectionsKilled: every connection of the relay is terminated
// (as in a PostgreSQL restart or failover); the relay reconnects and goes on
// publishing, its LISTEN connection included.
func TestDatabaseConnectionsKilled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pcfg, err := pgxpool.ParseConfig(b.dbURL)
	require.NoError(t, err)
	pcfg.ConnConfig.RuntimeParams["application_name"] = "relay-under-test"
	relayPool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(relayPool.Close)

	cfg := b.testConfig(t, b.publisher(t), &countingObserver{})
	cfg.Pool = relayPool
	cfg.PollInterval = time.Hour // only a notification (LISTEN re-established) wakes a partition
	start(t, cfg)
	b.enqueue(t, msgs(5, "k", "before")...)
	b.waitCount(t, "published", 5, 10*time.Second)

	terminate := func() int {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'relay-under-test'`).Scan(&n))
		return n
	}
	began := time.Now()
	require.Positive(t, terminate())
	// Wait for the LISTEN connection to come back before writing.
	require.Eventually(t, func() bool {
		var n int
		_ = b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND application_name = 'relay-under-test' AND query LIKE 'LISTEN%'`).Scan(&n)
		return n == 1
	}, 15*time.Second, 20*time.Millisecond)
	t.Logf("LISTEN back after %s", time.Since(began))
	b.enqueue(t, msgs(5, "k2", "after")...)
	b.waitCount(t, "published", 10, 15*time.Second)
	t.Logf("published after %s", time.Since(began))
}

// TestClaimStaysOnPendingIndexWhileDraining: statistics taken while a large
// backlog was all pending, then half of it published (not yet vacuumed):
// the read must still use the pending partial index, not walk the primary
// key past every published row.
func TestClaimStaysOnPendingIndexWhileDraining(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("loads 300,000 rows")
	}
	pool := testdb.New(t)
	// The fixture's keyed rows pay for their per-key sequences (and the
	// extra index on the mark): a loaded machine needs more than 2 minutes.
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	for _, q := range []string{
		`ALTER TABLE pgrelay.outbox SET UNLOGGED`,
		`ALTER TABLE pgrelay.outbox SET (autovacuum_enabled = false)`,
		`INSERT INTO pgrelay.outbox (event_id, topic, key) SELECT 'e-' || g, 'orders', 'key-' || (g % 1000) FROM generate_series(1, 300000) AS g`,
		`ANALYZE pgrelay.outbox`,
		`UPDATE pgrelay.outbox SET status = 'published', published_at = now() WHERE id <= 150000`,
	} {
		_, err := pool.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	var part int32
	require.NoError(t, pool.QueryRow(ctx, `SELECT pgrelay.outbox_partition('key-1')`).Scan(&part))
	var root testdb.PlanNode
	for range 2 { // the first read also marks the published rows' index entries dead
		ex := &testdb.Explain{DBTX: pool}
		_, err := db.New().PendingBatch(ctx, ex, db.PendingBatchParams{Partition: part, BatchSize: 500, Exclude: []int64{}})
		require.ErrorIs(t, err, testdb.ErrExplained)
		root = ex.Root(t)
		require.True(t, root.Uses("outbox_pending_idx"), "the claim must use the pending partial index: %s", ex.JSON)
	}
	buffers := root.SharedHit + root.SharedRead
	t.Logf("claim at half of a 300,000-row backlog: %d rows, %d buffers", root.ActualRows, buffers)
	require.Equal(t, 500, root.ActualRows)
	// The partial index still holds the published rows' entries until a
	// vacuum (a few thousand buffers here); the primary-key walk read
	// hundreds of thousands.
	require.LessOrEqual(t, buffers, 10000, "a claim must not walk the published rows")

	// The busy poll's read runs the same query per partition.
	ex := &testdb.Explain{DBTX: pool}
	_, err := db.New().PendingBatchMany(ctx, ex, db.PendingBatchManyParams{Partitions: []int32{part}, Afters: []int64{0}, BatchSize: 500})
	require.ErrorIs(t, err, testdb.ErrExplained)
	root = ex.Root(t)
	require.True(t, root.Uses("outbox_pending_idx"), "the busy poll must use the pending partial index: %s", ex.JSON)
	buffers = root.SharedHit + root.SharedRead
	t.Logf("busy poll at half of a 300,000-row backlog: %d rows, %d buffers", root.ActualRows, buffers)
	require.Equal(t, 500, root.ActualRows)
	require.LessOrEqual(t, buffers, 10000, "a busy poll must not walk the published rows")
}
