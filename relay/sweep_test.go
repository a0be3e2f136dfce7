package relay

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
)

// armedIdle starts a relay with cfg and waits until its 16 workers have
// armed their partitions and gone idle.
func (b *bundle) armedIdle(t *testing.T, cfg Config) *engine {
	t.Helper()
	r, _ := start(t, cfg)
	require.Eventually(t, func() bool {
		var armed int
		require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM pgrelay.relay_wakeups WHERE armed`).Scan(&armed))
		if armed != 16 {
			return false
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, w := range r.workers {
			if !w.idle.Load() {
				return false
			}
		}
		return len(r.workers) == 16
	}, 10*time.Second, 10*time.Millisecond, "the workers arm and idle")
	return r
}

// TestIdlePartitionsPolledInOneStatement: an idle relay polls its 16
// partitions with one statement per PollInterval (SweepIdle), not with a
// claim and a due-time read of each partition (32 statements).
func TestIdlePartitionsPolledInOneStatement(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var counting atomic.Bool
	var claims, sweeps atomic.Int64
	var mu sync.Mutex
	widest := 0
	cfg := b.testConfig(t, b.publisher(t), &countingObserver{})
	cfg.PollInterval = 100 * time.Millisecond
	cfg.hooks.afterRead = func(int32, int) {
		if counting.Load() {
			claims.Add(1)
		}
	}
	cfg.hooks.sweep = func(parts []int32) {
		if counting.Load() {
			sweeps.Add(1)
			mu.Lock()
			widest = max(widest, len(parts))
			mu.Unlock()
		}
	}
	b.armedIdle(t, cfg)
	counting.Store(true)
	began := time.Now()
	// Ten PollIntervals of sweeps (a second), with room for a loaded machine.
	require.Eventually(t, func() bool { return sweeps.Load() >= 10 }, 5*time.Second, 10*time.Millisecond,
		"the idle partitions are polled every PollInterval")
	counting.Store(false)
	t.Logf("%s idle at PollInterval 100ms: %d claims, %d sweeps", time.Since(began).Round(time.Millisecond), claims.Load(), sweeps.Load())
	require.Zero(t, claims.Load(), "idle workers read their partitions themselves")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 16, widest, "one sweep polls every idle partition")
}

// TestSweepFindsWhatNoNotificationAnnounced: a row committed while its
// partition was not armed (as a transaction that outlived arm's wait
// commits, or a row put back to pending by hand) sends no notification:
// the idle sweep finds it within about a PollInterval, and a delayed row
// inserted so is published at its due time, not at the sweep after it.
func TestSweepFindsWhatNoNotificationAnnounced(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := b.testConfig(t, b.publisher(t), &countingObserver{})
	cfg.PollInterval = 2 * time.Second
	swept := make(chan struct{}, 1)
	cfg.hooks.sweep = func([]int32) {
		select {
		case swept <- struct{}{}:
		default:
		}
	}
	nextSweep := func() {
		t.Helper()
		select {
		case <-swept:
		case <-time.After(3 * cfg.PollInterval):
			t.Fatal("no sweep of the idle partitions")
		}
	}
	b.armedIdle(t, cfg)
	ids := b.keysIn(t, 3, "quiet", 2)
	_, err := b.pool.Exec(ctx, `UPDATE pgrelay.relay_wakeups SET armed = false WHERE partition = 3`)
	require.NoError(t, err)

	// Right after a sweep: the next one comes a PollInterval later.
	nextSweep()
	nextSweep()
	inserted := time.Now()
	b.enqueue(t, pgrelay.Message{EventID: ids[0], Topic: "orders", Key: ids[0]})
	require.Eventually(t, func() bool { return b.statusOf(t, ids[0]) == "published" }, 3*cfg.PollInterval, 10*time.Millisecond,
		"a row no notification announced is published at the next sweep")
	t.Logf("unannounced row published after %s", time.Since(inserted).Round(time.Millisecond))

	// A delayed row due half a PollInterval after the next sweep: that
	// sweep sees it due before the one after, and wakes the worker then.
	_, err = b.pool.Exec(ctx, `UPDATE pgrelay.relay_wakeups SET armed = false WHERE partition = 3`)
	require.NoError(t, err)
	nextSweep()
	due := time.Now().Add(cfg.PollInterval + cfg.PollInterval/2)
	b.enqueue(t, pgrelay.Message{EventID: ids[1], Topic: "orders", Key: ids[1], NotBefore: due})
	require.Eventually(t, func() bool { return b.statusOf(t, ids[1]) == "published" }, 4*cfg.PollInterval, 10*time.Millisecond)
	_, notBefore, publishedAt := b.rowTimes(t, ids[1])
	late := publishedAt.Sub(*notBefore)
	t.Logf("unannounced delayed row published %s after its due time", late.Round(time.Millisecond))
	require.Less(t, late, cfg.PollInterval/4, "published at its due time, not at the sweep after it")
}
