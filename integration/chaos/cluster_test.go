package chaos

import (
	"context"
	"math/rand/v2"
	"os"
	"sort"
	"testing"
	"time"
)

// TestChaosNATSCluster runs the chaos suite on a three-node NATS JetStream
// cluster (nats-server processes routed on loopback, the stream replicated
// on all three), the relays and consumers connected to every node. The
// faults kill -9 one node at a time, the stream leader among them, and
// restart it while the producer writes; the checker's rules are the same:
// nothing lost, nothing doubled, each key's apply order kept.
func TestChaosNATSCluster(t *testing.T) {
	for _, bin := range []string{pgBinDir + "/initdb", natsServerBin} {
		if _, err := os.Stat(bin); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("chaos: the NATS cluster run needs %s: %v", bin, err)
			}
			t.Skipf("chaos: the NATS cluster run needs %s", bin)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	seed := *flagSeed
	if seed == 0 {
		seed = rand.Uint64N(1<<31) + 2
	}
	t.Logf("chaos seed %d on a NATS cluster (rerun: go test -run TestChaosNATSCluster -chaos.seed=%d ./integration/chaos/)", seed, seed)
	rep, err := Run(ctx, Config{
		Seed: seed, Duration: 30 * time.Second, DrainTimeout: 90 * time.Second, OrdersPerSecond: 60,
		BinDir: binaries(t), WorkDir: *flagWorkDir, Out: testWriter{t}, Broker: BrokerNATSCluster, Ordered: true,
	})
	if err != nil {
		t.Fatalf("seed %d: %v", seed, err)
	}
	if rep.Produced < 1500 || rep.OrderedKeys == 0 {
		t.Fatalf("seed %d: the run proved too little: %d events, %d keys order-checked", seed, rep.Produced, rep.OrderedKeys)
	}
	if rep.Faults["node-kill-leader"] == 0 || rep.Faults["node-kill-follower"] == 0 {
		t.Fatalf("seed %d: the run killed no leader or no follower: %v", seed, rep.Faults)
	}
	for role, stalls := range rep.NodeLossStalls {
		s := append([]time.Duration(nil), stalls...)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		t.Logf("node loss (%s): stream writes stalled %v (sorted)", role, s)
	}
}
