package relay

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
)

// stuckKeyPublisher fails every message of one key transiently, as a full
// subject with DiscardNew would, and publishes the others through the real
// publisher.
type stuckKeyPublisher struct {
	broker.Publisher
	key string
}

func (s *stuckKeyPublisher) Publish(ctx context.Context, msgs []pgrelay.Message) []broker.Result {
	out := make([]broker.Result, len(msgs))
	var pass []pgrelay.Message
	var idx []int
	for i, m := range msgs {
		if m.Key == s.key {
			out[i].Err = errors.New("maximum messages per subject exceeded")
			continue
		}
		pass = append(pass, m)
		idx = append(idx, i)
	}
	for j, r := range s.Publisher.Publish(ctx, pass) {
		out[idx[j]] = r
	}
	return out
}

// TestStuckKeyDoesNotBlockItsPartition: a key whose publishes keep failing
// transiently stays pending, in order, while every other key of the same
// partition is published once and marked.
func TestStuckKeyDoesNotBlockItsPartition(t *testing.T) {
	t.Parallel()
	b := setup(t)
	stuck := "stuck"
	p := b.partitionOf(t, stuck)
	var others []string
	for i := 0; len(others) < 3; i++ {
		if k := fmt.Sprintf("other-%d", i); b.partitionOf(t, k) == p {
			others = append(others, k)
		}
	}
	// The stuck key's event comes first in the partition.
	b.enqueue(t, pgrelay.Message{EventID: "stuck-0", Topic: "orders", Key: stuck})
	for _, k := range others {
		b.enqueue(t, msgs(2, k, k)...)
	}
	b.enqueue(t, pgrelay.Message{EventID: "stuck-1", Topic: "orders", Key: stuck})

	obs := &countingObserver{}
	start(t, b.testConfig(t, &stuckKeyPublisher{Publisher: b.publisher(t), key: stuck}, obs))
	b.waitCount(t, "published", 2*len(others), 10*time.Second)
	require.Eventually(t, func() bool { return obs.failed.Load() >= 3 }, 10*time.Second, 10*time.Millisecond, "the stuck key is retried")
	require.Equal(t, 2, b.count(t, "pending"), "only the stuck key's events stay pending")
	require.Equal(t, uint64(2*len(others)), b.streamMsgs(t), "each other event reached the stream once")
	require.Zero(t, obs.duplicates.Load(), "no other event was republished")
	var attempts int
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT max(attempts) FROM pgrelay.outbox WHERE key <> $1`, stuck).Scan(&attempts))
	require.Equal(t, 1, attempts, "each other event was published in one attempt")
}

// TestPipelinedBatchesPublishOnceInOrder: with small batches, each full
// batch is marked in the background while the next one is read and
// published; every event is still published once (the next read skips the
// rows being marked) and every key in order.
func TestPipelinedBatchesPublishOnceInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const keys, perKey = 4, 60
	for k := range keys {
		b.enqueue(t, msgs(perKey, fmt.Sprintf("p%d", k), fmt.Sprintf("p%d", k))...)
	}
	obs := &countingObserver{}
	cfg := b.testConfig(t, b.publisher(t), obs)
	cfg.BatchSize = 10
	sub := b.subscribe(t)
	start(t, cfg)
	b.waitCount(t, "published", keys*perKey, 20*time.Second)
	last := map[string]int{}
	for seen := 0; seen < keys*perKey; seen++ {
		select {
		case r := <-sub:
			require.Equal(t, last[r.key]+1, r.seq, "key %s out of order at %s", r.key, r.eventID)
			last[r.key] = r.seq
		case <-time.After(10 * time.Second):
			t.Fatalf("only %d messages in the stream", seen)
		}
	}
	require.Equal(t, uint64(keys*perKey), b.streamMsgs(t))
	eventually(t, func() bool { return obs.published.Load() == keys*perKey }, "every event observed published")
	require.Zero(t, obs.duplicates.Load(), "no event was published twice")
	var attempts int
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT max(attempts) FROM pgrelay.outbox`).Scan(&attempts))
	require.Equal(t, 1, attempts)
}
