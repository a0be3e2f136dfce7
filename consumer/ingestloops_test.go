package consumer

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
)

// queueSubscriber hands out its batches one per Fetch, then nothing.
type queueSubscriber struct {
	mu      sync.Mutex
	batches [][]broker.Delivery
}

func (s *queueSubscriber) Fetch(ctx context.Context, _ int, maxWait time.Duration) ([]broker.Delivery, error) {
	s.mu.Lock()
	var ds []broker.Delivery
	if len(s.batches) > 0 {
		ds, s.batches = s.batches[0], s.batches[1:]
	}
	s.mu.Unlock()
	if len(ds) == 0 {
		select {
		case <-ctx.Done():
		case <-time.After(maxWait):
		}
	}
	return ds, nil
}

func (s *queueSubscriber) Close() error { return nil }

// push queues one more batch.
func (s *queueSubscriber) push(ds ...broker.Delivery) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.batches = append(s.batches, ds)
}

// TestIngestLoopsStoreAtOnceWithoutDeadlocks: with several ingest loops,
// batches are stored in concurrent transactions, and two batches holding the
// same new event ids in opposite orders, stored at the same moment (the
// test's hook starts each pair's stores together), neither deadlock nor store
// anything twice: Receive inserts a batch's rows in key order, so concurrent
// inserts of one key wait for each other instead of each holding what the
// other needs (TestOverlappingReceivesDoNotDeadlock, in the inbox). Every
// delivery is acknowledged, after its own batch committed.
func TestIngestLoopsStoreAtOnceWithoutDeadlocks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const ids, pairs = 400, 6
	acks := &ackedDeliveries{}
	sub := &queueSubscriber{}
	for p := range pairs {
		var msgs []pgrelay.Message
		for i := range ids {
			msgs = append(msgs, pgrelay.Message{EventID: fmt.Sprintf("p%d-ev-%03d", p, i), Topic: "orders", EventType: "Step",
				Payload: []byte(`{}`), OccurredAt: time.Now()})
		}
		desc := slices.Clone(msgs)
		slices.Reverse(desc)
		sub.batches = append(sub.batches, acks.deliveries(msgs...), acks.deliveries(desc...))
	}
	cfg := b.cfg
	cfg.Subscribe = func(context.Context) (broker.Subscriber, error) { return sub, nil }
	cfg.disableWorkers = true
	cfg.FetchBatchSize = ids
	cfg.IngestLoops = 4
	c, err := newConsumer(cfg)
	require.NoError(t, err)
	// Each pair's two stores start together: the first waits for the
	// second, which only a concurrent loop can start.
	var mu sync.Mutex
	partner := map[string]chan struct{}{}
	seen := map[string]int{}
	var together atomic.Int64
	c.beforeStore = func(in []pgrelay.Incoming) {
		pair := in[0].EventID[:strings.IndexByte(in[0].EventID, '-')]
		mu.Lock()
		seen[pair]++
		n := seen[pair]
		ch := partner[pair]
		if n == 1 {
			ch = make(chan struct{})
			partner[pair] = ch
		}
		mu.Unlock()
		switch n {
		case 1:
		case 2:
			close(ch)
			return
		default:
			return // a retry
		}
		select {
		case <-ch:
			together.Add(1)
		case <-time.After(5 * time.Second):
		}
	}
	b.start(t, c)
	require.Eventually(t, func() bool { return len(acks.ids()) == 2*ids*pairs }, 60*time.Second, 20*time.Millisecond,
		"every delivery acknowledged")
	require.EqualValues(t, pairs, together.Load(), "each pair's batches were stored at once")
	s := c.Stats()
	require.Zero(t, s.StoreErrors, "no store failed (a deadlock would)")
	require.EqualValues(t, ids*pairs, s.Inserted)
	require.EqualValues(t, ids*pairs, s.Duplicates)
	require.Equal(t, ids*pairs, count(t, b, `SELECT count(*) FROM pgrelay.inbox`))
}
