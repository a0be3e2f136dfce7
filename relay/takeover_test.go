package relay

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
)

// TestKilledRelayPartitionsMoveAtOnce: two relays with 15 s leases share the
// partitions; the one running as a child process is SIGKILLed, and the events
// written into its partitions right after are published by the survivor
// within 3 s, long before the leases expire: the survivor saw the dead
// relay's lock session end (its advisory lock gone) and took its partitions
// lockValidFor later. Fencing is unchanged (TestZombieRelayIsFenced).
func TestKilledRelayPartitionsMoveAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", "CHILD_LEASE=15s", "CHILD_HEARTBEAT=1s", "CHILD_DATABASE_URL="+b.dbURL, "CHILD_NATS_URL="+b.natsURL,
		"CHILD_PREFIX="+b.prefix, "CHILD_STREAM="+b.stream)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	owned := func(owner string) []int32 {
		rows, err := b.pool.Query(context.Background(),
			`SELECT partition FROM pgrelay.relay_partitions WHERE owner = $1 AND lease_until > now() ORDER BY partition`, owner)
		require.NoError(t, err)
		parts, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		require.NoError(t, err)
		return parts
	}
	require.Eventually(t, func() bool { return len(owned("child")) == 16 }, 20*time.Second, 20*time.Millisecond, "the child relay owns every partition")

	obs := &countingObserver{}
	cfg := b.testConfig(t, b.publisher(t), obs)
	cfg.NodeID, cfg.Lease, cfg.HeartbeatInterval = "survivor", 15*time.Second, time.Second
	start(t, cfg)
	require.Eventually(t, func() bool { return len(owned("child")) == 8 && len(owned("survivor")) == 8 }, 20*time.Second, 20*time.Millisecond,
		"the two relays share the partitions")

	// One key in each of the child's partitions.
	childParts := owned("child")
	var events []pgrelay.Message
	for i := 0; len(events) < len(childParts); i++ {
		key := fmt.Sprintf("key-%d", i)
		p := b.partitionOf(t, key)
		if !slices.Contains(childParts, p) || slices.ContainsFunc(events, func(m pgrelay.Message) bool { return b.partitionOf(t, m.Key) == p }) {
			continue
		}
		events = append(events, pgrelay.Message{EventID: "after-kill-" + key, Topic: "orders", Key: key, EventType: "OrderCreated", Payload: []byte("1")})
	}

	require.NoError(t, cmd.Process.Kill()) // SIGKILL: no shutdown, no release
	_ = cmd.Wait()
	killed := time.Now()
	b.enqueue(t, events...)
	require.Eventually(t, func() bool { return b.count(t, "published") == len(events) }, 3*time.Second-time.Since(killed), 10*time.Millisecond,
		"the survivor publishes the dead relay's partitions within 3 s of the kill (leases of 15 s)")
	t.Logf("the %d events written after the kill were published %s after it", len(events), time.Since(killed).Round(time.Millisecond))
	require.Len(t, owned("survivor"), 16)
	require.EqualValues(t, len(childParts), obs.takenOver.Load(), "the child's partitions were taken over")
	// Not before lockValidFor: a relay cut off from PostgreSQL, whose session
	// the server ended, may publish until then.
	var first time.Time
	require.NoError(t, b.pool.QueryRow(context.Background(),
		`SELECT min(acquired_at) FROM pgrelay.relay_partitions WHERE partition = ANY($1)`, childParts).Scan(&first))
	require.GreaterOrEqual(t, first.Sub(killed), lockValidFor-100*time.Millisecond, "taken over no sooner than lockValidFor after the kill")
}

// TestEndedLockSessionStopsPublishing: relay A's first publish hangs at the
// broker when the backend of its lock connection is terminated (its session
// ends, as when the server drops it). The batch in flight runs to its
// PublishTimeout (a cancelled publish whose confirms were on their way would
// leave the broker holding events the outbox calls unpublished); no batch
// starts under the ended session; A's next session releases the leases of
// the ended one and takes the partition again at a new epoch, and every
// event is published.
func TestEndedLockSessionStopsPublishing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.enqueue(t, msgs(5, "order-1", "s")...)
	p := b.partitionOf(t, "order-1")

	pub := &hangingPublisher{Publisher: b.publisher(t), entered: make(chan struct{}), cancelled: make(chan time.Time, 1)}
	cfg := b.testConfig(t, pub, &countingObserver{})
	cfg.NodeID, cfg.Lease, cfg.HeartbeatInterval, cfg.PublishTimeout = "relay-a", 15*time.Second, time.Second, 2*time.Second
	start(t, cfg)
	<-pub.entered
	_, epoch := b.owner(t, p)

	var pid int
	require.NoError(t, b.pool.QueryRow(context.Background(), `
		SELECT l.pid FROM pg_locks l JOIN pgrelay.relay_nodes n ON ((l.classid::bigint << 32) | l.objid::bigint) = n.lock_key
		WHERE n.node_id = 'relay-a' AND l.locktype = 'advisory' AND l.granted AND l.objsubid = 1`).Scan(&pid))
	terminated := time.Now()
	_, err := b.pool.Exec(context.Background(), `SELECT pg_terminate_backend($1)`, pid)
	require.NoError(t, err)
	// The batch in flight is not cut short by the session's end (its
	// confirms may be on their way): it ends at PublishTimeout.
	select {
	case at := <-pub.cancelled:
		require.GreaterOrEqual(t, at.Sub(terminated), time.Second, "the publish in flight ran to its timeout")
	case <-time.After(10 * time.Second):
		t.Fatal("the publish in flight never ended")
	}
	b.waitCount(t, "published", 5, 10*time.Second)
	_, newEpoch := b.owner(t, p)
	require.Greater(t, newEpoch, epoch, "taken again under the new session")
}

// hangingPublisher holds its first Publish until its context ends, and
// records when; later calls go through.
type hangingPublisher struct {
	broker.Publisher
	once      sync.Once
	entered   chan struct{}
	cancelled chan time.Time
}

func (h *hangingPublisher) Publish(ctx context.Context, msgs []pgrelay.Message) []broker.Result {
	first := false
	h.once.Do(func() { first = true })
	if !first {
		return h.Publisher.Publish(ctx, msgs)
	}
	close(h.entered)
	<-ctx.Done()
	h.cancelled <- time.Now()
	out := make([]broker.Result, len(msgs))
	for i := range out {
		out[i].Err = ctx.Err()
	}
	return out
}
