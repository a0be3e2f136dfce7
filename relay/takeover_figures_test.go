package relay

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay"
	"github.com/stretchr/testify/require"
)

// TestTakeoverFigures measures commit → published across relay SIGKILLs
// (docs/relay.md, "Partitions, leases and fencing"): a relay in this process
// and one in a child process, 15 s leases (the default, heartbeat every 5 s),
// 100 one-event transactions a second over random keys; five times the child
// is started, given 2 s once it holds partitions, SIGKILLed, and left dead
// for 2 s. It prints commit (created_at) → published (published_at) p50, p99
// and max of every event written meanwhile, with the load average. Run with
// PGRELAY_TAKEOVER_FIGURES=1.
func TestTakeoverFigures(t *testing.T) {
	if os.Getenv("PGRELAY_TAKEOVER_FIGURES") == "" {
		t.Skip("figures: set PGRELAY_TAKEOVER_FIGURES=1")
	}
	const kills, rate = 5, 100
	b := setup(t)
	cfg := b.testConfig(t, b.publisher(t), &countingObserver{})
	cfg.NodeID, cfg.Lease, cfg.HeartbeatInterval, cfg.PollInterval = "survivor", 15*time.Second, 5*time.Second, time.Second
	start(t, cfg)

	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(time.Second / rate)
		defer tick.Stop()
		for i := 0; ctx.Err() == nil; i++ {
			<-tick.C
			key := fmt.Sprintf("key-%d", i%997)
			b.enqueue(t, pgrelay.Message{EventID: fmt.Sprintf("e-%d", i), Topic: "orders", Key: key, EventType: "OrderCreated", Payload: []byte("1")})
		}
	}()

	owns := func(owner string) int {
		var n int
		require.NoError(t, b.pool.QueryRow(context.Background(),
			`SELECT count(*) FROM pgrelay.relay_partitions WHERE owner = $1 AND lease_until > now()`, owner).Scan(&n))
		return n
	}
	require.Eventually(t, func() bool { return owns("survivor") == 16 }, 20*time.Second, 20*time.Millisecond)
	for k := range kills {
		id := fmt.Sprintf("victim-%d", k)
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"=1", "CHILD_LEASE=15s", "CHILD_NODE_ID="+id, "CHILD_DATABASE_URL="+b.dbURL,
			"CHILD_NATS_URL="+b.natsURL, "CHILD_PREFIX="+b.prefix, "CHILD_STREAM="+b.stream)
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		began := time.Now()
		for owns(id) == 0 && time.Since(began) < 30*time.Second {
			time.Sleep(20 * time.Millisecond)
		}
		time.Sleep(2 * time.Second)
		held := owns(id)
		require.NoError(t, cmd.Process.Kill())
		_ = cmd.Wait()
		t.Logf("kill %d: %s held %d partitions (%s after its start), load %s", k+1, id, held, time.Since(began).Round(time.Millisecond), loadAvg())
		time.Sleep(2 * time.Second)
	}
	stop()
	wg.Wait()
	require.Eventually(t, func() bool { return b.count(t, "pending") == 0 }, 60*time.Second, 50*time.Millisecond)
	var n int
	var p50, p99, maxMs float64
	require.NoError(t, b.pool.QueryRow(context.Background(), `
		SELECT count(*)::int,
		       percentile_cont(0.5) WITHIN GROUP (ORDER BY d), percentile_cont(0.99) WITHIN GROUP (ORDER BY d), max(d)
		FROM (SELECT extract(epoch FROM published_at - created_at) * 1000 AS d FROM pgrelay.outbox) s`).Scan(&n, &p50, &p99, &maxMs))
	t.Logf("FIGURES %d events, %d SIGKILLs: commit → published p50 %.0f ms, p99 %.0f ms, max %.0f ms; load %s",
		n, kills, p50, p99, maxMs, loadAvg())
}

// loadAvg returns the 1, 5 and 15 minute load averages.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}
