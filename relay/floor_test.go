package relay

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/db"
	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/migrations"
)

// floorProbe records where each claim of partition p starts its scan.
type floorProbe struct {
	mu    sync.Mutex
	p     int32
	after int64 // the highest start seen
}

func (f *floorProbe) hook(p int32, after int64) {
	if p != f.p {
		return
	}
	f.mu.Lock()
	f.after = max(f.after, after)
	f.mu.Unlock()
}

func (f *floorProbe) highest() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.after
}

// keysOf returns n event ids, unkeyed (no key lock), in partition p.
func (b *bundle) keysOf(t *testing.T, p int32, prefix string, n int) []string {
	var out []string
	for i := 0; len(out) < n; i++ {
		if k := fmt.Sprintf("%s-%d", prefix, i); b.partitionOf(t, k) == p {
			out = append(out, k)
		}
	}
	return out
}

func (b *bundle) idOf(t *testing.T, eventID string) int64 {
	var id int64
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT id FROM pgrelay.outbox WHERE event_id = $1`, eventID).Scan(&id))
	return id
}

func (b *bundle) statusOf(t *testing.T, eventID string) string {
	var s string
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT status FROM pgrelay.outbox WHERE event_id = $1`, eventID).Scan(&s))
	return s
}

// TestScanFloorWaitsForEarlierTransactions: a row whose transaction drew
// its id before later rows were published, and committed after, is still
// published, although the claims' floor moves past the later rows. With
// no claim from the start for an hour, only the floor's wait for that
// transaction (the claim's snapshot xmin against the mark's xid) keeps it
// readable. "insert in progress" pauses the insert itself after the
// outbox's trigger drew the row's id and before the row is written: only
// the trigger taking the xid first (migration 00121) makes the
// transaction visible to the relay's claims then.
func TestScanFloorWaitsForEarlierTransactions(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"open transaction", "insert in progress"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			// A private cluster: the floor waits for every transaction of
			// the server that may have drawn a lower id, and other tests'
			// transactions would hold it.
			b, _ := walSetup(t, "")
			ctx := context.Background()
			const p = 0
			ids := b.keysOf(t, p, "floor", 7)
			if mode == "insert in progress" {
				_, err := b.pool.Exec(ctx, `
CREATE FUNCTION public.pause_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.event_id = '`+ids[0]+`' THEN PERFORM pg_advisory_xact_lock(4242); END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER zz_pause_insert BEFORE INSERT ON pgrelay.outbox FOR EACH ROW EXECUTE FUNCTION public.pause_insert();`)
				require.NoError(t, err)
				// nextval writes WAL (and so takes an xid) for one call in
				// 32 only: this one, so that the early row's does not.
				_, err = b.pool.Exec(ctx, `SELECT nextval('pgrelay.outbox_id_seq')`)
				require.NoError(t, err)
			}
			probe := &floorProbe{p: p}
			cfg := b.testConfig(t, b.publisher(t), &countingObserver{})
			cfg.hooks.floorFullEvery = time.Hour
			cfg.hooks.claimFrom = probe.hook
			start(t, cfg)

			// The early transaction: it draws its row's id, then stalls.
			gate, err := b.pool.Acquire(ctx)
			require.NoError(t, err)
			defer gate.Release()
			if mode == "insert in progress" {
				_, err = gate.Exec(ctx, `SELECT pg_advisory_lock(4242)`)
				require.NoError(t, err)
			}
			early, err := b.pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = early.Rollback(ctx) }()
			inserted := make(chan error, 1)
			go func() {
				_, err := early.Exec(ctx, `INSERT INTO pgrelay.outbox (event_id, topic, event_type, payload) VALUES ($1, 'orders', 'OrderPaid', '{}')`, ids[0])
				inserted <- err
			}()
			if mode == "open transaction" {
				require.NoError(t, <-inserted)
			} else {
				require.Eventually(t, func() bool {
					var waiting bool
					require.NoError(t, b.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND objid = 4242 AND NOT granted)`).Scan(&waiting))
					return waiting
				}, 10*time.Second, 5*time.Millisecond, "the early insert waits in its trigger")
			}

			// Later rows, one batch at a time, published and marked; the
			// floor moves up to below the early row at most.
			for _, id := range ids[1:4] {
				b.enqueue(t, pgrelay.Message{EventID: id, Topic: "orders"})
				require.Eventually(t, func() bool { return b.statusOf(t, id) == "published" }, 10*time.Second, 5*time.Millisecond)
			}
			if mode == "insert in progress" {
				_, err = gate.Exec(ctx, `SELECT pg_advisory_unlock(4242)`)
				require.NoError(t, err)
				require.NoError(t, <-inserted)
			}
			var earlyID int64
			require.NoError(t, early.QueryRow(ctx, `SELECT id FROM pgrelay.outbox WHERE event_id = $1`, ids[0]).Scan(&earlyID))
			require.Less(t, earlyID, b.idOf(t, ids[1]), "the early row drew the lowest id")
			require.NoError(t, early.Commit(ctx))
			require.Less(t, probe.highest(), earlyID, "the floor never passed the early row")
			require.Eventually(t, func() bool { return b.statusOf(t, ids[0]) == "published" }, 5*time.Second, 10*time.Millisecond,
				"the early row is published (floor at %d)", probe.highest())

			// Once it has ended, the floor moves past the later rows.
			for _, id := range ids[4:] {
				b.enqueue(t, pgrelay.Message{EventID: id, Topic: "orders"})
				require.Eventually(t, func() bool { return b.statusOf(t, id) == "published" }, 10*time.Second, 5*time.Millisecond)
			}
			require.Eventually(t, func() bool { return probe.highest() >= b.idOf(t, ids[4]) }, 5*time.Second, 5*time.Millisecond,
				"the floor moves on (at %d)", probe.highest())
		})
	}
}

// TestScanFloorPassesPublishedRows: while a transaction holds the xmin
// horizon (a REPEATABLE READ snapshot, no xid), the claims of a partition
// start past the rows already published, and that start is what keeps the
// claim off their dead index entries: the same claim from the start reads
// far more buffers. A requeue's notification sends the next claim back to
// the start: the requeued row, below the floor, is published again at once.
func TestScanFloorPassesPublishedRows(t *testing.T) {
	t.Parallel()
	b, _ := walSetup(t, "") // a private cluster, as above
	ctx := context.Background()
	const p = 0
	holder, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = holder.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ`)
	require.NoError(t, err)
	_, err = holder.Exec(ctx, `SELECT count(*) FROM pgrelay.relay_partitions`)
	require.NoError(t, err)

	probe := &floorProbe{p: p}
	cfg := b.testConfig(t, b.publisher(t), &countingObserver{})
	cfg.BatchSize = 100
	cfg.hooks.floorFullEvery = time.Hour
	cfg.hooks.claimFrom = probe.hook
	start(t, cfg)

	ids := b.keysOf(t, p, "held", 2000)
	var first int64
	for round := range 20 {
		var batch []pgrelay.Message
		for _, id := range ids[round*100 : (round+1)*100] {
			batch = append(batch, pgrelay.Message{EventID: id, Topic: "orders"})
		}
		b.enqueue(t, batch...)
		if round == 0 {
			first = b.idOf(t, ids[99])
		}
		last := ids[(round+1)*100-1]
		require.Eventually(t, func() bool { return b.statusOf(t, last) == "published" }, 10*time.Second, 5*time.Millisecond)
	}
	require.Eventually(t, func() bool { return probe.highest() >= first }, 5*time.Second, 5*time.Millisecond,
		"the claims start past the first round's rows (highest start %d, first round up to %d)", probe.highest(), first)

	// Under the held horizon the dead entries stay; from the floor the claim
	// reads a fraction of the buffers a claim from the start reads.
	buffers := func(after int64) int {
		ex := &testdb.Explain{DBTX: b.pool}
		_, err := db.New().PendingBatch(ctx, ex, db.PendingBatchParams{Partition: p, After: after, BatchSize: 100, Exclude: []int64{}})
		require.ErrorIs(t, err, testdb.ErrExplained)
		root := ex.Root(t)
		return root.SharedHit + root.SharedRead
	}
	fromStart, fromFloor := buffers(0), buffers(probe.highest())
	t.Logf("claim of partition %d: %d buffers from the start, %d from the floor %d", p, fromStart, fromFloor, probe.highest())
	require.Less(t, fromFloor*4, fromStart, "the floor keeps the claim off the published rows' entries")

	// A requeued row below the floor is published again at once.
	requeued := ids[0]
	_, err = b.pool.Exec(ctx, `UPDATE pgrelay.outbox SET status = 'dead', last_error = 'test' WHERE event_id = $1`, requeued)
	require.NoError(t, err)
	q := db.New()
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := q.AdminRequeueOutboxDead(ctx, tx, db.AdminRequeueOutboxDeadParams{Actor: "test", Reason: "test", Ids: []int64{b.idOf(t, requeued)}}); err != nil {
			return err
		}
		return q.AdminNotifyOutbox(ctx, tx, []int32{p})
	}))
	require.Eventually(t, func() bool { return b.statusOf(t, requeued) == "published" }, 3*time.Second, 10*time.Millisecond,
		"the requeued row is published again")
}

// TestScanFloorNeedsItsMigration: on a database whose outbox trigger does
// not take the xid first (migrated down below floorSchema), a Relay's claims
// scan from the start: the floor's reasoning does not hold there. Migrated
// up while served, the floor is on from the next schema read.
func TestScanFloorNeedsItsMigration(t *testing.T) {
	t.Parallel()
	b, _ := walSetup(t, "") // a private cluster, as above
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sqlDB := stdlib.OpenDBFromPool(b.pool)
	defer sqlDB.Close()
	mp, err := migrations.NewProvider(sqlDB)
	require.NoError(t, err)
	_, err = mp.DownTo(ctx, floorSchema-1)
	require.NoError(t, err)

	const p = 0
	probe := &floorProbe{p: p}
	cfg := b.testConfig(t, b.publisher(t), &countingObserver{})
	cfg.hooks.floorFullEvery = time.Hour
	cfg.hooks.claimFrom = probe.hook
	cfg.hooks.schemaInterval = 100 * time.Millisecond
	migrated := make(chan struct{})
	var once sync.Once
	cfg.hooks.schemaNoted = func(v int64) {
		if v >= floorSchema {
			once.Do(func() { close(migrated) })
		}
	}
	runRelay(t, cfg)
	ids := b.keysOf(t, p, "old", 400)
	publish := func(round int) {
		var batch []pgrelay.Message
		for _, id := range ids[round*20 : (round+1)*20] {
			batch = append(batch, pgrelay.Message{EventID: id, Topic: "orders"})
		}
		b.enqueue(t, batch...)
		last := ids[(round+1)*20-1]
		require.Eventually(t, func() bool { return b.statusOf(t, last) == "published" }, 10*time.Second, 5*time.Millisecond)
	}
	for round := range 10 {
		publish(round)
	}
	require.Zero(t, probe.highest(), "every claim scans from the start")

	_, err = mp.Up(ctx)
	require.NoError(t, err)
	// The rounds below take a few ms each: they start once the relay has
	// read the new version, or they could all be over before it knew.
	select {
	case <-migrated:
	case <-ctx.Done():
		t.Fatal("the relay never read the migrated schema")
	}
	round := 10
	require.Eventually(t, func() bool {
		publish(round)
		round++
		return probe.highest() > 0 || round == 20
	}, 30*time.Second, time.Millisecond)
	require.Positive(t, probe.highest(), "migrated, the floor moves")
}

// TestScanFloorUnderConcurrentProducers: producers committing one row per
// transaction as fast as they can, keyed and not, while the claims' floor
// moves (no claim from the start for an hour): every row is published, in
// its key's order, none waits for a claim from the start.
func TestScanFloorUnderConcurrentProducers(t *testing.T) {
	t.Parallel()
	b, _ := walSetup(t, "") // a private cluster, as above
	probe := &floorProbe{p: 0}
	cfg := b.testConfig(t, b.publisher(t), &countingObserver{})
	cfg.hooks.floorFullEvery = time.Hour
	cfg.hooks.claimFrom = probe.hook
	start(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				key := ""
				if g%2 == 0 {
					key = fmt.Sprintf("k%d", i%7)
				}
				_, err := b.pool.Exec(ctx, `INSERT INTO pgrelay.outbox (event_id, topic, key, event_type, payload) VALUES ($1, 'orders', $2, 'OrderPaid', '{}')`,
					fmt.Sprintf("p%d-%d", g, i), key)
				if ctx.Err() != nil {
					return
				}
				require.NoError(t, err)
			}
		})
	}
	wg.Wait()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM pgrelay.outbox`).Scan(&n))
	require.Eventually(t, func() bool { return b.count(t, "pending") == 0 }, 3*time.Second, 10*time.Millisecond,
		"every row is published without a claim from the start (%d pending of %d)", b.count(t, "pending"), n)
	require.Positive(t, probe.highest(), "the floor moved")
	t.Logf("%d rows, partition 0's floor at %d", n, probe.highest())
}

// TestScanFloorRules: the floor's arithmetic, without a database.
func TestScanFloorRules(t *testing.T) {
	t.Parallel()
	rows := func(xmin int64, waiting bool, ids ...int64) []db.PendingBatchRow {
		out := make([]db.PendingBatchRow, len(ids))
		for i, id := range ids {
			out[i] = db.PendingBatchRow{ID: id, SnapshotXmin: xmin, Waiting: waiting}
		}
		return out
	}
	now := time.Now()
	f := &scanFloor{fullEvery: time.Hour, maxEvery: time.Hour}
	require.Zero(t, f.start(now), "the first claim starts from the start")
	f.read(0, time.Millisecond, rows(100, false, 10, 11), nil)
	f.marked(11, 120)
	f.read(0, 0, rows(119, false, 20), nil)
	require.Zero(t, f.start(now), "xid 119 may still commit a row below 11")
	f.read(0, 0, rows(120, true, 20), nil)
	require.Zero(t, f.start(now), "a delayed row holds a key: rows below may be held")
	f.read(0, 0, rows(120, false, 20, 21), []int64{15, 16})
	require.EqualValues(t, 11, f.start(now), "settled up to 11, nothing pending below it")

	f.marked(21, 130)
	f.read(11, 0, rows(131, false, 18, 25), []int64{22})
	require.EqualValues(t, 17, f.start(now), "the lowest row returned bounds it")
	f.marked(25, 140)
	f.read(17, 0, rows(140, false, 30), []int64{19})
	require.EqualValues(t, 18, f.start(now), "and so does the batch whose mark is in flight")

	f.rescan()
	require.Zero(t, f.start(now), "after a rescan, from the start")
	f.read(0, 0, rows(150, false, 5, 40), nil)
	require.EqualValues(t, 4, f.start(now), "a requeued row below the floor lowers it")

	f.reset()
	require.Zero(t, f.start(now))
	f.read(0, 0, rows(1000, false, 50), nil)
	require.Zero(t, f.start(now), "reset forgets the waiting candidate too")
}
