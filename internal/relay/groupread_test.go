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
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/event"
)

// readTracer counts, while on, the statements reading pending rows
// (PendingBatch, PendingBatchMany, and the former PendingPartitions) that
// returned rows.
type readTracer struct {
	on    atomic.Bool
	reads atomic.Int64
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
	r, _ := start(t, cfg)
	keys, parts := b.distinctPartitionKeys(t, k)
	one := func(prefix string) []event.Message {
		ms := make([]event.Message, k)
		for i, key := range keys {
			ms[i] = event.Message{EventID: fmt.Sprintf("%s-%d", prefix, i), Topic: "orders", Key: key}
		}
		return ms
	}
	// lingering reports whether every worker lingers for another 100 ms at
	// least (or is being read for).
	lingering := func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		soon := time.Now().Add(100 * time.Millisecond).UnixNano()
		for _, p := range parts {
			w := r.workers[p]
			if w == nil {
				return false
			}
			if u := w.lingerUntil.Load(); u >= 0 && u < soon {
				return false
			}
		}
		return true
	}
	published := 0
	for attempt := range 20 {
		b.enqueue(t, one(fmt.Sprintf("warm%d", attempt))...)
		published += k
		b.waitCount(t, "published", published, 10*time.Second)
		if !lingering() {
			continue
		}
		tr.reads.Store(0)
		tr.on.Store(true)
		b.enqueue(t, one(fmt.Sprintf("probe%d", attempt))...)
		published += k
		b.waitCount(t, "published", published, 10*time.Second)
		tr.on.Store(false)
		require.EqualValues(t, 1, tr.reads.Load(), "statements that read the %d lingering partitions' new rows", k)
		return
	}
	t.Fatal("the workers never lingered together")
}

// TestStoppedWorkerNeverPublishesPolledRows: pollBusy reads a row for a
// lingering worker, and before it hands the row over the worker loses its
// lease: stopped, as a heartbeat finding the partition taken stops it, or
// past its lease deadline (its heartbeats stalled). Either way the row is
// not published; it stays pending for the partition's new owner.
func TestStoppedWorkerNeverPublishesPolledRows(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"stopped", "deadline"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			p := b.partitionOf(t, "victim")
			var armed, fired, ended atomic.Bool
			var rp atomic.Pointer[Relay]
			var once sync.Once
			cfg := b.testConfig(t, b.publisher(t), &countingObserver{})
			cfg.PollInterval = time.Hour
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
						w.leaseUntil.Store(0)
					}
					fired.Store(true)
				})
			}
			cfg.hooks.beforeHeartbeat = func() {
				for fired.Load() && how == "deadline" && !ended.Load() {
					time.Sleep(10 * time.Millisecond) // heartbeats stalled: the deadline stays passed
				}
			}
			r, _ := start(t, cfg)
			rp.Store(r)
			t.Cleanup(func() { ended.Store(true) }) // before the relay stops
			b.enqueue(t, event.Message{EventID: "first", Topic: "orders", Key: "victim"})
			b.waitCount(t, "published", 1, 10*time.Second)
			armed.Store(true)
			b.enqueue(t, event.Message{EventID: "second", Topic: "orders", Key: "victim"})
			require.Eventually(t, fired.Load, 10*time.Second, time.Millisecond, "pollBusy read the row")
			time.Sleep(time.Second)
			require.Equal(t, uint64(1), b.streamMsgs(t), "the row read for the stopped worker was published")
			require.Equal(t, 1, b.count(t, "pending"))
		})
	}
}
