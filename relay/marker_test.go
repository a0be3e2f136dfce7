package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/db"
)

// markTracer counts the mark statements sent on a pool's connections.
type markTracer struct{ marks atomic.Int64 }

func (c *markTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if strings.Contains(data.SQL, "name: MarkOutcomesMany") {
		c.marks.Add(1)
	}
	return ctx
}

func (c *markTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// markFixture is a Relay (not running) whose marks the test sends itself,
// one pending row in each of its partitions, which "test" leases at epoch 7.
type markFixture struct {
	b      *bundle
	r      *engine
	obs    *countingObserver
	tracer *markTracer
	parts  []int32
	rows   map[int32][]db.PendingBatchRow
	// statements receives the partitions of each mark statement; the first
	// statement is held until release is closed.
	statements chan []int32
	release    chan struct{}
}

func newMarkFixture(t *testing.T, partitions int, queryTimeout time.Duration) *markFixture {
	t.Helper()
	b := setup(t)
	f := &markFixture{b: b, obs: &countingObserver{}, tracer: &markTracer{}, rows: map[int32][]db.PendingBatchRow{},
		statements: make(chan []int32, 16), release: make(chan struct{})}
	seen := map[int32]bool{}
	for i := 0; len(f.parts) < partitions; i++ {
		key := fmt.Sprintf("key-%d", i)
		p := b.partitionOf(t, key)
		if seen[p] {
			continue
		}
		seen[p] = true
		f.parts = append(f.parts, p)
		b.enqueue(t, msgs(2, key, key)...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := b.pool.Exec(ctx, `UPDATE pgrelay.relay_partitions SET owner = 'test', epoch = 7, lease_until = now() + interval '1 hour'
		WHERE partition = ANY($1)`, f.parts)
	require.NoError(t, err)
	for _, p := range f.parts {
		rows, err := db.New().PendingBatch(ctx, b.pool, db.PendingBatchParams{Partition: p, Exclude: []int64{}, BatchSize: 10})
		require.NoError(t, err)
		require.Len(t, rows, 2)
		f.rows[p] = rows
	}

	pcfg, err := pgxpool.ParseConfig(b.dbURL)
	require.NoError(t, err)
	pcfg.ConnConfig.Tracer = f.tracer
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	cfg := b.testConfig(t, b.publisher(t), f.obs)
	cfg.Pool, cfg.NodeID, cfg.NoListen = pool, "test", true
	if queryTimeout > 0 {
		cfg.QueryTimeout = queryTimeout
	}
	var first sync.Once
	cfg.hooks.beforeMarkStatement = func(parts []int32) {
		f.statements <- slices.Clone(parts)
		first.Do(func() {
			select {
			case <-f.release:
			case <-time.After(20 * time.Second):
			}
		})
	}
	f.r, err = newEngine(cfg)
	require.NoError(t, err)
	return f
}

// markAll marks each partition's rows through Relay.mark, as its worker
// would at epoch 7: the first partition's mark alone, held in flight, then
// the others at once, released once they are all queued. It returns each
// partition's outcome.
func (f *markFixture) markAll(t *testing.T) map[int32]error {
	t.Helper()
	var mu sync.Mutex
	errs := map[int32]error{}
	var wg sync.WaitGroup
	markOne := func(p int32) {
		defer wg.Done()
		w := &worker{partition: p, epoch: 7}
		ids := rowIDs(f.rows[p])
		err := f.r.mark(w, slog.New(slog.DiscardHandler), f.rows[p], outcomes{markIDs: ids, deadIDs: []int64{}, reasons: []string{}, published: len(ids)}, nil)
		mu.Lock()
		errs[p] = err
		mu.Unlock()
	}
	wg.Add(len(f.parts))
	go markOne(f.parts[0])
	select {
	case parts := <-f.statements:
		require.Equal(t, f.parts[:1], parts, "the first mark goes at once, alone")
	case <-time.After(10 * time.Second):
		t.Fatal("the first mark was not sent")
	}
	for _, p := range f.parts[1:] {
		go markOne(p)
	}
	eventually(t, func() bool {
		f.r.marker.mu.Lock()
		defer f.r.marker.mu.Unlock()
		return len(f.r.marker.queue) == len(f.parts)-1
	}, "the other marks queue while the first is in flight")
	close(f.release)
	wg.Wait()
	return errs
}

func (f *markFixture) statuses(t *testing.T) map[int32][]string {
	t.Helper()
	rows, err := f.b.pool.Query(context.Background(), `SELECT partition, status FROM pgrelay.outbox ORDER BY id`)
	require.NoError(t, err)
	out := map[int32][]string{}
	for rows.Next() {
		var p int32
		var s string
		require.NoError(t, rows.Scan(&p, &s))
		out[p] = append(out[p], s)
	}
	require.NoError(t, rows.Err())
	return out
}

// TestMarksArrivingTogetherGoOutAsOneStatement: the marks of several
// partitions handed to the marker while a mark is in flight go out as one
// statement once it ends (group commit), and each worker gets its own
// outcome and its own Observer calls. Sending each mark alone takes four
// statements.
func TestMarksArrivingTogetherGoOutAsOneStatement(t *testing.T) {
	t.Parallel()
	f := newMarkFixture(t, 4, 0)
	errs := f.markAll(t)
	for _, p := range f.parts {
		require.NoError(t, errs[p], "partition %d", p)
	}
	select {
	case parts := <-f.statements:
		require.ElementsMatch(t, f.parts[1:], parts, "the queued marks go out together")
	default:
		t.Fatal("no second statement")
	}
	require.EqualValues(t, 2, f.tracer.marks.Load(), "mark statements sent for 4 partitions")
	for _, p := range f.parts {
		require.Equal(t, []string{"published", "published"}, f.statuses(t)[p], "partition %d", p)
	}
	require.EqualValues(t, 8, f.obs.published.Load())
	require.Zero(t, f.obs.fenced.Load())
}

// TestFencedPartitionInCombinedMark: in one statement with the marks of
// other partitions, a partition owned by another relay and one this relay
// re-acquired at a later epoch mark nothing and their workers get
// errFenced, while the other partitions' rows are marked. The first is
// owned by the other relay at the mark's epoch, so that the owner alone
// fences it, and the second by this relay, so that the epoch alone does:
// without either check in the query's lease CTE, a fenced partition's rows
// are marked published.
func TestFencedPartitionInCombinedMark(t *testing.T) {
	t.Parallel()
	f := newMarkFixture(t, 4, 0)
	takenOver, reacquired := f.parts[2], f.parts[3]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := f.b.pool.Exec(ctx, `UPDATE pgrelay.relay_partitions SET owner = 'other' WHERE partition = $1`, takenOver)
	require.NoError(t, err)
	_, err = f.b.pool.Exec(ctx, `UPDATE pgrelay.relay_partitions SET epoch = 8 WHERE partition = $1`, reacquired)
	require.NoError(t, err)

	errs := f.markAll(t)
	require.EqualValues(t, 2, f.tracer.marks.Load(), "the three queued marks go out as one statement")
	statuses := f.statuses(t)
	for _, p := range f.parts[:2] {
		require.NoError(t, errs[p], "partition %d", p)
		require.Equal(t, []string{"published", "published"}, statuses[p], "partition %d", p)
	}
	for _, p := range []int32{takenOver, reacquired} {
		require.ErrorIs(t, errs[p], errFenced, "partition %d", p)
		require.Equal(t, []string{"pending", "pending"}, statuses[p], "partition %d", p)
	}
	require.EqualValues(t, 2, f.obs.fenced.Load())
	require.EqualValues(t, 4, f.obs.published.Load())
}

// TestFailedCombinedMarkFailsEveryMark: a combined statement that fails
// (here: it times out on the locked outbox) fails the mark of every
// partition in it, none as fenced, and leaves their rows pending (their
// workers back off and publish them again).
func TestFailedCombinedMarkFailsEveryMark(t *testing.T) {
	t.Parallel()
	f := newMarkFixture(t, 3, 500*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The rows of all partitions but the first are locked until the marks
	// are done.
	tx, err := f.b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM pgrelay.outbox WHERE partition = ANY($1) FOR UPDATE`, f.parts[1:])
	require.NoError(t, err)
	errs := f.markAll(t)
	// The client gave up at its timeout; the server ends the statement only
	// when the cancel request reaches it. Releasing the locks before that
	// would let the abandoned statement mark the rows after all (harmless
	// in production: its rows are republished and deduplicated, but not
	// what this test checks).
	require.Eventually(t, func() bool {
		var n int
		err := f.b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND state = 'active' AND query LIKE '%MarkOutcomesMany%'
			  AND pid <> pg_backend_pid()`).Scan(&n)
		return err == nil && n == 0
	}, 5*time.Second, 10*time.Millisecond, "the timed-out mark still runs on the server")
	require.NoError(t, tx.Rollback(ctx))
	require.NoError(t, errs[f.parts[0]])
	for _, p := range f.parts[1:] {
		require.Error(t, errs[p], "partition %d", p)
		require.False(t, errors.Is(errs[p], errFenced), "partition %d: %v", p, errs[p])
		require.Equal(t, []string{"pending", "pending"}, f.statuses(t)[p], "partition %d", p)
	}
	require.EqualValues(t, 2, f.tracer.marks.Load())
	require.Zero(t, f.obs.fenced.Load())
}

// TestCombinedMarkAndRenewalDoNotDeadlock: a combined mark locks its lease
// rows one after another, and a renewal locks all of the relay's. Holding
// the lower partition's row (as the mark does once it locked it), the
// renewal must not take the higher one first: the mark would then wait for
// it, and it for the mark, a deadlock PostgreSQL breaks by failing one of
// them. RenewLeases locks in partition order, as the mark does, so it waits
// holding nothing. Here the lower partition's lease row lies after the
// higher one's in the table, where the renewal's scan meets it last.
func TestCombinedMarkAndRenewalDoNotDeadlock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	byPart := map[int32]string{}
	for i := 0; len(byPart) < 2; i++ {
		key := fmt.Sprintf("key-%d", i)
		p := b.partitionOf(t, key)
		if _, ok := byPart[p]; !ok {
			byPart[p] = key
			b.enqueue(t, msgs(1, key, key)...)
		}
	}
	var parts []int32
	for p := range byPart {
		parts = append(parts, p)
	}
	slices.Sort(parts)
	low, high := parts[0], parts[1]
	for _, q := range []string{
		`UPDATE pgrelay.relay_partitions SET owner = 'me', epoch = 7, lease_until = now() + interval '1 hour' WHERE partition = ANY($1)`,
		`UPDATE pgrelay.relay_partitions SET acquired_at = now() WHERE partition = $1`, // its row moves last
	} {
		arg := any(parts)
		if strings.Contains(q, "= $1") {
			arg = low
		}
		_, err := b.pool.Exec(ctx, q, arg)
		require.NoError(t, err)
	}
	var ids []int64
	rows, err := b.pool.Query(ctx, `SELECT id FROM pgrelay.outbox ORDER BY id`)
	require.NoError(t, err)
	ids, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)

	// The mark's transaction, holding the lower lease row.
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM pgrelay.relay_partitions WHERE partition = $1 FOR SHARE`, low)
	require.NoError(t, err)
	var pid int
	require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))

	renewed := make(chan error, 1)
	go func() {
		got, err := db.New().RenewLeases(ctx, b.pool, db.RenewLeasesParams{LeaseSeconds: 60, Owner: "me"})
		if err == nil && len(got) != 2 {
			err = fmt.Errorf("renewed %d leases, want 2", len(got))
		}
		renewed <- err
	}()
	eventually(t, func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%name: RenewLeases%' AND $1 = ANY(pg_blocking_pids(pid))`, pid).Scan(&n))
		return n == 1
	}, "the renewal waits for the mark's lease row")

	marked, err := db.New().MarkOutcomesMany(ctx, tx, db.MarkOutcomesManyParams{Owner: "me", Partitions: parts, Epochs: []int64{7, 7},
		Ids: ids, DeadIds: []int64{}, DeadReasons: []string{}})
	require.NoError(t, err, "the combined mark")
	for i := range marked {
		marked[i].Xid = 0 // the mark's transaction (scanFloor)
	}
	require.ElementsMatch(t, []db.MarkOutcomesManyRow{{Partition: low, Marked: 1}, {Partition: high, Marked: 1}}, marked)
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-renewed, "the renewal")
}

// TestIdleMarkerSendsOnTheCallersGoroutine: a mark handed to an idle marker
// is sent by the goroutine that hands it over (its worker), not by a
// goroutine started for it: no goroutine to start, and no hand-over to it
// and back, per mark.
func TestIdleMarkerSendsOnTheCallersGoroutine(t *testing.T) {
	t.Parallel()
	f := newMarkFixture(t, 1, 0)
	close(f.release)
	var stack string
	f.r.cfg.hooks.beforeMarkStatement = func([]int32) {
		buf := make([]byte, 64<<10)
		stack = string(buf[:runtime.Stack(buf, false)])
	}
	p := f.parts[0]
	ids := rowIDs(f.rows[p])
	err := f.r.mark(&worker{partition: p, epoch: 7}, slog.New(slog.DiscardHandler), f.rows[p], outcomes{markIDs: ids, deadIDs: []int64{}, reasons: []string{}, published: len(ids)}, nil)
	require.NoError(t, err)
	require.Contains(t, stack, "relay.(*engine).mark(", "the mark statement's goroutine")
	require.Equal(t, []string{"published", "published"}, f.statuses(t)[p])
	f.r.marker.mu.Lock()
	defer f.r.marker.mu.Unlock()
	require.False(t, f.r.marker.running, "the marker is idle again")
}
