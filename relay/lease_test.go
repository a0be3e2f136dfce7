package relay

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
)

// countingPublisher counts the Publish calls that reach it.
type countingPublisher struct {
	broker.Publisher
	calls atomic.Int64
}

func (c *countingPublisher) Publish(ctx context.Context, msgs []pgrelay.Message) []broker.Result {
	c.calls.Add(1)
	return c.Publisher.Publish(ctx, msgs)
}

// TestRelayPausedPastLeaseNeverPublishes: relay A reads a batch and is paused
// (worker and heartbeat) between the read and the publish until its lease
// has expired and relay B has taken the partition and published the rows.
// When A resumes, it publishes nothing: it checks its own lease deadline,
// measured on its monotonic clock, before publishing.
func TestRelayPausedPastLeaseNeverPublishes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.enqueue(t, msgs(5, "order-1", "z")...)
	p := b.partitionOf(t, "order-1")

	var paused atomic.Bool
	resumeA := make(chan struct{})
	enteredA := make(chan struct{})
	var once, resumeOnce sync.Once
	resume := func() { resumeOnce.Do(func() { close(resumeA) }) }

	pubA := &countingPublisher{Publisher: b.publisher(t)}
	cfgA := b.testConfig(t, pubA, &countingObserver{})
	cfgA.NodeID = "relay-a"
	cfgA.hooks.beforePublish = func(part int32) {
		if part != p {
			return
		}
		once.Do(func() {
			paused.Store(true)
			close(enteredA)
			<-resumeA
		})
	}
	cfgA.hooks.beforeHeartbeat = func() {
		if paused.Load() {
			<-resumeA
		}
	}
	a, _ := start(t, cfgA)
	t.Cleanup(resume)
	<-enteredA

	obsB := &countingObserver{}
	cfgB := b.testConfig(t, b.publisher(t), obsB)
	cfgB.NodeID = "relay-b"
	start(t, cfgB)
	b.waitCount(t, "published", 5, 15*time.Second)
	require.Equal(t, "relay-b", func() string { o, _ := b.owner(t, p); return o }())

	paused.Store(false)
	resume()
	// A's worker for the partition ends once its heartbeat finds the lease
	// taken; whatever it did before that, it published nothing.
	require.Eventually(t, func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.workers[p] == nil
	}, 15*time.Second, 5*time.Millisecond, "A gives the partition up")
	require.Zero(t, pubA.calls.Load(), "the paused relay published its old batch")
	require.Equal(t, uint64(5), b.streamMsgs(t))
	require.Zero(t, obsB.duplicates.Load())
}

// TestReleasedPartitionsTakenOverAtOnce: a relay that stops releases its
// partitions and tells its peers, which take them at once, not at their
// next heartbeat (here 10 s away).
func TestReleasedPartitionsTakenOverAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pub := b.publisher(t)
	ownedBy := func(node string) int {
		var n int
		require.NoError(t, b.pool.QueryRow(context.Background(),
			`SELECT count(*) FROM pgrelay.relay_partitions WHERE owner = $1 AND lease_until > now()`, node).Scan(&n))
		return n
	}
	// Both relays heartbeat only every 10 s.
	cfg := func() Config {
		c := b.testConfig(t, pub, &countingObserver{})
		c.Lease, c.HeartbeatInterval = 30*time.Second, 10*time.Second
		return c
	}
	a, stopA := start(t, cfg())
	require.Eventually(t, func() bool { return ownedBy(a.NodeID()) == 16 }, 10*time.Second, 10*time.Millisecond)
	c, _ := start(t, cfg())
	// A gives up half at its next heartbeat, and C takes them.
	began := time.Now()
	require.Eventually(t, func() bool { return ownedBy(c.NodeID()) == 8 && ownedBy(a.NodeID()) == 8 }, 40*time.Second, 10*time.Millisecond)
	t.Logf("rebalanced after %s", time.Since(began))

	stopA()
	began = time.Now()
	require.Eventually(t, func() bool { return ownedBy(c.NodeID()) == 16 }, 3*time.Second, 5*time.Millisecond,
		"the survivor must take the released partitions within 3 s, not at its next heartbeat (10 s)")
	t.Logf("taken over %s after the stopped relay returned", time.Since(began))
}

// TestPartitionsHeldReported: each heartbeat reports the partitions the relay
// works, which follow a rebalance (the relay_partitions_held gauge).
func TestPartitionsHeldReported(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pub := b.publisher(t)
	obsA, obsB := &countingObserver{}, &countingObserver{}
	_, _ = start(t, b.testConfig(t, pub, obsA))
	require.Eventually(t, func() bool { return obsA.held.Load() == 16 }, 10*time.Second, 10*time.Millisecond)
	_, _ = start(t, b.testConfig(t, pub, obsB))
	require.Eventually(t, func() bool { return obsA.held.Load() == 8 && obsB.held.Load() == 8 }, 20*time.Second, 10*time.Millisecond,
		"after the rebalance each relay reports its half (A %d, B %d)", obsA.held.Load(), obsB.held.Load())
}
