package relay

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay"
	"github.com/stretchr/testify/require"
)

// lingerK starts a relay (cfg changed by mod first) whose workers of k
// partitions linger after two rounds of one row each, so that only pollBusy
// reads them, and returns the bundle, the keys (one per partition) and a
// function enqueueing one row per key in one transaction.
func lingerK(t *testing.T, k int, mod func(*Config)) (b *bundle, parts []int32, round func(prefix string)) {
	t.Helper()
	b = setup(t)
	cfg := b.testConfig(t, b.publisher(t), &countingObserver{})
	cfg.PollInterval = time.Hour // only a notification or the busy poll finds rows
	cfg.hooks.lingerFor = 10 * time.Second
	cfg.hooks.lingerMinRows = 1 // linger after a single row
	mod(&cfg)
	r, _ := start(t, cfg)
	keys, parts := b.distinctPartitionKeys(t, k)
	published := 0
	round = func(prefix string) {
		ms := make([]pgrelay.Message, k)
		for i, key := range keys {
			ms[i] = pgrelay.Message{EventID: fmt.Sprintf("%s-%d", prefix, i), Topic: "orders", Key: key}
		}
		b.enqueue(t, ms...)
		published += k
		b.waitCount(t, "published", published, 10*time.Second)
	}
	round("warm0")
	round("warm1")
	require.Eventually(t, func() bool {
		for _, p := range parts {
			if !b.lingering(r, p) {
				return false
			}
		}
		return true
	}, 5*time.Second, time.Millisecond, "the workers linger")
	return b, parts, round
}

// TestPollRoundMarkedInOneStatement: the rows one pollBusy read hands to the
// workers of k partitions are marked with one statement: the marker holds
// the round's first mark until the others arrive. (Sent as it came, the
// first mark went alone and the others together after it: two statements
// per read, each with its commit.)
func TestPollRoundMarkedInOneStatement(t *testing.T) {
	t.Parallel()
	const k = 4
	var counting atomic.Bool
	var mu sync.Mutex
	var statements [][]int32
	var reads atomic.Int64
	_, parts, round := lingerK(t, k, func(cfg *Config) {
		// The round's first mark waits for the others however slowly a
		// loaded machine publishes them: what is checked is that it waits.
		cfg.hooks.roundWait = 10 * time.Second
		cfg.hooks.beforeMarkStatement = func(ps []int32) {
			if counting.Load() {
				mu.Lock()
				statements = append(statements, slices.Clone(ps))
				mu.Unlock()
			}
		}
		cfg.hooks.pollRead = func(_ []int32, rows int) {
			if counting.Load() && rows > 0 {
				reads.Add(1)
			}
		}
	})
	for i := range 5 {
		counting.Store(true)
		round(fmt.Sprintf("probe%d", i))
		counting.Store(false)
		mu.Lock()
		got := statements
		statements = nil
		mu.Unlock()
		if reads.Swap(0) != 1 {
			continue // the rows came in two reads: not one round
		}
		require.Len(t, got, 1, "mark statements for one read's rows of %d partitions: %v", k, got)
		require.ElementsMatch(t, parts, got[0])
		return
	}
	t.Fatal("the rows never came in one read")
}

// TestPollPausesLongerAfterFewRows: after a read that found rows, fewer
// than busyPollFull, pollBusy reads again only busyPollCoalesce later, so
// that the next read finds several rows rather than one; after a read of
// busyPollFull rows or more, busyPollInterval later.
func TestPollPausesLongerAfterFewRows(t *testing.T) {
	t.Parallel()
	require.Equal(t, busyPollInterval, busyPollPause(busyPollFull))
	require.Equal(t, busyPollCoalesce, busyPollPause(1))
	var counting atomic.Bool
	var mu sync.Mutex
	var ended time.Time // when the last read that found rows returned
	var pauses []time.Duration
	_, _, round := lingerK(t, 4, func(cfg *Config) {
		cfg.hooks.pollStart = func() {
			mu.Lock()
			defer mu.Unlock()
			if counting.Load() && !ended.IsZero() {
				pauses = append(pauses, time.Since(ended))
			}
			ended = time.Time{}
		}
		cfg.hooks.pollRead = func(_ []int32, rows int) {
			if rows > 0 {
				mu.Lock()
				ended = time.Now()
				mu.Unlock()
			}
		}
	})
	counting.Store(true)
	for i := range 10 {
		round(fmt.Sprintf("probe%d", i))
	}
	counting.Store(false)
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, pauses)
	require.GreaterOrEqual(t, slices.Min(pauses), busyPollCoalesce, "from the end of a read that found rows to the next read: %v", pauses)
}
