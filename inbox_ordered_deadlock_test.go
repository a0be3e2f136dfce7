package pgrelay_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// deadlocks returns the deadlocks PostgreSQL counted in the test's database.
// Backends report them at their next idle moment: the pool is emptied first
// (a closing backend flushes its counters), and the count is read until it
// settles.
func deadlocks(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	pool.Reset()
	n, last := 0, -1
	for i := 0; i < 20 && n != last; i++ {
		last = n
		time.Sleep(200 * time.Millisecond)
		n = queryInt(t, pool, `SELECT deadlocks::int FROM pg_stat_database WHERE datname = current_database()`)
	}
	return n
}

// TestOrderedScanAndBatchesDoNotDeadlock runs two ordered workers, each with
// several goroutines and a scan every millisecond, over interleaved keys
// whose events arrive out of order, so that the scan holds and wakes events
// while batches claim, mark and advance them. Every lock the scan takes must
// be one it can take without waiting, or in the batches' order: no deadlock
// (each costs a rolled-back batch), and every key applies in sequence.
func TestOrderedScanAndBatchesDoNotDeadlock(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	h := applyLog(t, pool, nil)
	const keys, perKey = 12, 40
	var stops []func()
	for range 2 {
		cfg := orderedConfig(t, pool, h, nil)
		cfg.Workers = 4
		cfg.BatchSize = 10
		cfg.PollInterval = time.Millisecond
		stops = append(stops, startWorker(t, cfg))
	}

	// Each round delivers, for every key, the next chunk of its sequences
	// reversed and shuffled across keys: most of a chunk waits for its
	// first event.
	rng := rand.New(rand.NewPCG(1, 2))
	const chunk = 8
	for from := int64(1); from <= perKey; from += chunk {
		var msgs []pgrelay.Incoming
		for k := range keys {
			for s := from + chunk - 1; s >= from; s-- {
				msgs = append(msgs, seqMsg(fmt.Sprintf("k%d-%d", k, s), fmt.Sprintf("k%d", k), s))
			}
		}
		rng.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
		for len(msgs) > 0 {
			n := min(len(msgs), 7)
			receive(t, pool, msgs[:n]...)
			msgs = msgs[n:]
		}
		time.Sleep(20 * time.Millisecond)
	}
	want := make([]int64, perKey)
	for i := range want {
		want[i] = int64(i + 1)
	}
	for k := range keys {
		waitSeqs(t, pool, fmt.Sprintf("k%d", k), want)
	}
	for _, stop := range stops {
		stop()
	}
	require.Zero(t, deadlocks(t, pool), "deadlocks between the ordered scan and the batches")
}
