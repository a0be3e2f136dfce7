package relay

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgrelay/pgrelay"
	"github.com/stretchr/testify/require"
)

// readTracer counts, while on, the statements reading pending rows
// (PendingBatch, PendingBatchMany, and the former PendingPartitions) that
// returned rows.
type readTracer struct {
	on    atomic.Bool
	reads atomic.Int64
	mu    sync.Mutex
	log   []string // each counted statement's name and rows
}

type tracedSQL struct{}

func (c *readTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, tracedSQL{}, data.SQL)
}

func (c *readTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	sql, _ := ctx.Value(tracedSQL{}).(string)
	if !c.on.Load() || data.Err != nil || data.CommandTag.RowsAffected() == 0 {
		return
	}
	if strings.HasPrefix(sql, "-- name: PendingBatch") || strings.HasPrefix(sql, "-- name: PendingPartitions") {
		c.reads.Add(1)
		name, _, _ := strings.Cut(strings.TrimPrefix(sql, "-- name: "), " ")
		c.mu.Lock()
		c.log = append(c.log, fmt.Sprintf("%s: %d rows", name, data.CommandTag.RowsAffected()))
		c.mu.Unlock()
	}
}

// distinctPartitionKeys returns n keys of n different partitions.
func (b *bundle) distinctPartitionKeys(t *testing.T, n int) ([]string, []int32) {
	var keys []string
	var parts []int32
	for i := 0; len(keys) < n; i++ {
		k := fmt.Sprintf("spread-%d", i)
		if p := b.partitionOf(t, k); !slices.Contains(parts, p) {
			keys, parts = append(keys, k), append(parts, p)
		}
	}
	return keys, parts
}

// lingering reports whether p's worker lingers for another 100 ms at least
// (or is being read for).
func (b *bundle) lingering(r *engine, p int32) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	w := r.workers[p]
	if w == nil {
		return false
	}
	u := w.lingerUntil.Load()
	return u < 0 || u >= time.Now().Add(100*time.Millisecond).UnixNano()
}

// TestLingeringPartitionsReadInOneStatement: k partitions whose workers
// linger (they published rows in the last lingerFor) receive a row each in
// one transaction; the rows are read with one statement (pollBusy's
// PendingBatchMany), not one probe plus one read per partition.
func TestLingeringPartitionsReadInOneStatement(t *testing.T) {
	t.Parallel()
	const k = 4
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tr := &readTracer{}
	pcfg, err := pgxpool.ParseConfig(b.dbURL)
	require.NoError(t, err)
	pcfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	cfg := b.testConfig(t, b.publisher(t), &countingObserver{})
	cfg.Pool = pool
	cfg.PollInterval = time.Hour // only a notification or the busy poll finds rows
	// Long enough that no worker's linger ends (and the worker reads on
	// its own) while the test's transactions commit on a loaded machine.
	cfg.hooks.lingerFor = 10 * time.Second
	cfg.hooks.lingerMinRows = 1 // linger after a single row
	r, _ := start(t, cfg)
	keys, parts := b.distinctPartitionKeys(t, k)
	one := func(prefix string) []pgrelay.Message {
		ms := make([]pgrelay.Message, k)
		for i, key := range keys {
			ms[i] = pgrelay.Message{EventID: fmt.Sprintf("%s-%d", prefix, i), Topic: "orders", Key: key}
		}
		return ms
	}
	lingering := func() bool {
		for _, p := range parts {
			if !b.lingering(r, p) {
				return false
			}
		}
		return true
	}
	// Settle: the LISTEN connection up (it wakes every worker once), then
	// two rounds of rows, the second finding (and leaving) the partitions
	// disarmed, so that no notification wakes a worker: only the busy
	// poll reads.
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND query LIKE 'LISTEN%'`).Scan(&n))
		return n == 1
	}, 10*time.Second, 5*time.Millisecond, "the relay listens")
	for round := range 2 {
		b.enqueue(t, one(fmt.Sprintf("warm%d", round))...)
		b.waitCount(t, "published", (round+1)*k, 10*time.Second)
	}
	require.Eventually(t, lingering, 5*time.Second, time.Millisecond, "the workers linger")
	var armed int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM pgrelay.relay_wakeups WHERE armed AND partition = ANY($1)`, parts).Scan(&armed))
	require.Zero(t, armed, "lingering workers do not arm")
	tr.on.Store(true)
	b.enqueue(t, one("probe")...)
	b.waitCount(t, "published", 3*k, 10*time.Second)
	tr.on.Store(false)
	require.EqualValues(t, 1, tr.reads.Load(), "statements that read the %d lingering partitions' new rows: %v", k, tr.log)
}

// TestStoppedWorkerNeverPublishesPolledRows: pollBusy reads a row for a
// lingering worker, and before it hands the row over the worker loses its
// lease: stopped, as a heartbeat finding the partition taken stops it, or
// past its lease deadline (its heartbeats stalled while the rows waited). Either way the row is
// not published; it stays pending for the partition's new owner.
func TestStoppedWorkerNeverPublishesPolledRows(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"stopped", "deadline"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			p := b.partitionOf(t, "victim")
			var armed, fired, stall, ended atomic.Bool
			var rp atomic.Pointer[engine]
			var once sync.Once
			cfg := b.testConfig(t, b.publisher(t), &countingObserver{})
			cfg.PollInterval = time.Hour
			cfg.hooks.lingerFor = 10 * time.Second
			cfg.hooks.lingerMinRows = 1 // linger after a single row
			cfg.hooks.pollRead = func(partitions []int32, rows int) {
				if !armed.Load() || rows == 0 || !slices.Contains(partitions, p) {
					return
				}
				once.Do(func() {
					r := rp.Load()
					r.mu.Lock()
					w := r.workers[p]
					r.mu.Unlock()
					switch how {
					case "stopped":
						// The lease taken over, and the heartbeat noticing it.
						_, err := b.pool.Exec(context.Background(), `UPDATE pgrelay.relay_partitions
							SET owner = 'thief', epoch = epoch + 1, lease_until = now() + interval '1 hour' WHERE partition = $1`, p)
						if err != nil {
							t.Error(err)
						}
						r.mu.Lock()
						w.stop(false)
						r.mu.Unlock()
					case "deadline":
						// Heartbeats stall, and the lease deadline passes
						// while the read's rows wait (a heartbeat in flight
						// may extend it once).
						stall.Store(true)
						var since time.Time
						for {
							switch {
							case time.Now().Before(r.leaseEnd(w)):
								since = time.Time{}
							case since.IsZero():
								since = time.Now()
							case time.Since(since) > 300*time.Millisecond:
								fired.Store(true)
								return
							}
							time.Sleep(5 * time.Millisecond)
						}
					}
					fired.Store(true)
				})
			}
			cfg.hooks.beforeHeartbeat = func() {
				for stall.Load() && !ended.Load() {
					time.Sleep(10 * time.Millisecond) // heartbeats stalled: the deadline stays passed
				}
			}
			r, _ := start(t, cfg)
			rp.Store(r)
			t.Cleanup(func() { ended.Store(true) }) // before the relay stops
			published := 0
			for attempt := range 20 {
				b.enqueue(t, pgrelay.Message{EventID: fmt.Sprintf("warm-%d", attempt), Topic: "orders", Key: "victim"})
				published++
				b.waitCount(t, "published", published, 10*time.Second)
				if !b.lingering(r, p) {
					continue
				}
				armed.Store(true)
				b.enqueue(t, pgrelay.Message{EventID: fmt.Sprintf("victim-%d", attempt), Topic: "orders", Key: "victim"})
				require.Eventually(t, func() bool { return fired.Load() || b.count(t, "published") > published },
					10*time.Second, time.Millisecond, "the row was neither read by pollBusy nor published")
				if !fired.Load() {
					// The worker's linger ended first: it read the row itself.
					armed.Store(false)
					published++
					b.waitCount(t, "published", published, 10*time.Second)
					continue
				}
				time.Sleep(time.Second)
				require.Equal(t, uint64(published), b.streamMsgs(t), "the row read for the stopped worker was published")
				require.Equal(t, 1, b.count(t, "pending"))
				return
			}
			t.Fatal("the worker never lingered")
		})
	}
}

// TestLingeringWorkersSleepThroughEmptyPolls: while k partitions linger with
// nothing to read, pollBusy keeps reading them every busyPollInterval, and
// each empty read gives the workers their linger back without waking them:
// a worker wakes only for a batch, a nudge or its linger's end. (Woken by
// every empty poll, k workers woke k times per poll, about 500 times a
// second each.)
func TestLingeringWorkersSleepThroughEmptyPolls(t *testing.T) {
	t.Parallel()
	const k = 4
	b := setup(t)
	cfg := b.testConfig(t, b.publisher(t), &countingObserver{})
	cfg.PollInterval = time.Hour // only a notification or the busy poll finds rows
	cfg.hooks.lingerFor = 10 * time.Second
	cfg.hooks.lingerMinRows = 1 // linger after a single row
	var counting atomic.Bool
	var wakes, emptyPolls atomic.Int64
	cfg.hooks.lingerWoke = func(int32) {
		if counting.Load() {
			wakes.Add(1)
		}
	}
	cfg.hooks.pollRead = func(parts []int32, rows int) {
		if counting.Load() && rows == 0 && len(parts) >= k {
			emptyPolls.Add(1)
		}
	}
	r, _ := start(t, cfg)
	keys, parts := b.distinctPartitionKeys(t, k)
	for round := range 2 {
		ms := make([]pgrelay.Message, k)
		for i, key := range keys {
			ms[i] = pgrelay.Message{EventID: fmt.Sprintf("warm%d-%d", round, i), Topic: "orders", Key: key}
		}
		b.enqueue(t, ms...)
		b.waitCount(t, "published", (round+1)*k, 10*time.Second)
	}
	require.Eventually(t, func() bool {
		for _, p := range parts {
			if !b.lingering(r, p) {
				return false
			}
		}
		return true
	}, 5*time.Second, time.Millisecond, "the workers linger")
	counting.Store(true)
	require.Eventually(t, func() bool { return emptyPolls.Load() >= 20 }, 10*time.Second, time.Millisecond, "pollBusy reads the idle lingering partitions")
	counting.Store(false)
	require.LessOrEqual(t, wakes.Load(), int64(k), "lingering workers woken during %d empty polls of their partitions", emptyPolls.Load())
}
