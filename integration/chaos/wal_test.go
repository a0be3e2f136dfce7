package chaos

import (
	"context"
	"math/rand/v2"
	"os"
	"testing"
	"time"
)

// TestChaosWAL is the chaos run with the relays capturing from the WAL
// (--capture wal, emptying pgrelay.outbox_wal every 2s) and the producer
// writing each transaction's events with pgrelay.Emit or as rows of
// pgrelay.outbox_wal (seeded, half each; one new order in eight is created
// and paid in one transaction that does both): the same
// faults (relays SIGKILLed and SIGSTOPped, PostgreSQL and NATS restarted,
// latency, resets and partitions on both links, injected duplicates and
// poison) and the same checker, which takes the produced events from the
// producer's commits. A short run with a random seed (printed);
// -chaos.ordered runs the consumers ordered and checks each key's apply
// order with the sequences the WAL relays assign.
func TestChaosWAL(t *testing.T) {
	if _, err := os.Stat(pgBinDir + "/initdb"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("chaos: needs PostgreSQL server binaries in %s: %v", pgBinDir, err)
		}
		t.Skipf("chaos: needs PostgreSQL server binaries in %s", pgBinDir)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	seed := *flagSeed
	if seed == 0 {
		seed = rand.Uint64N(1<<31) + 2
	}
	duration := 30 * time.Second
	if *flagDuration > 0 {
		duration = *flagDuration
	}
	t.Logf("chaos WAL seed %d (rerun: go test ./integration/chaos -run TestChaosWAL -chaos.seed=%d)", seed, seed)
	rep, err := Run(ctx, Config{
		Seed: seed, Duration: duration, BinDir: binaries(t), WorkDir: *flagWorkDir, Out: testWriter{t},
		Broker: BrokerNATS, BrokerRestart: true, Capture: "wal", Ordered: *flagOrdered,
	})
	if err != nil {
		t.Fatalf("seed %d: %v", seed, err)
	}
	if rep.Produced == 0 || rep.Credits == 0 || len(rep.Faults) == 0 || *flagOrdered && rep.OrderedKeys == 0 {
		t.Fatalf("seed %d: the run proved nothing: %d events, %d credits, %d fault kinds", seed, rep.Produced, rep.Credits, len(rep.Faults))
	}
	if rep.WALTableEvents == 0 || rep.WALTableEvents == rep.Produced || rep.WALMixedTxs == 0 || rep.WALTableLeft >= rep.WALTableEvents {
		t.Fatalf("seed %d: the run did not mix the ways: %d of %d events inserted into pgrelay.outbox_wal, %d mixed transactions, %d rows never truncated",
			seed, rep.WALTableEvents, rep.Produced, rep.WALMixedTxs, rep.WALTableLeft)
	}
}
