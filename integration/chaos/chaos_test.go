package chaos

import (
	"context"
	"flag"
	"math/rand/v2"
	"os"
	"testing"
	"time"
)

var (
	flagDuration = flag.Duration("chaos.duration", 0, "fault phase of one long run (e.g. 20m); 0 runs the short CI mode: a fixed seed and a random one")
	flagSeed     = flag.Uint64("chaos.seed", 0, "seed of the run; 0 picks a random one (printed)")
	flagWorkDir  = flag.String("chaos.workdir", "", "directory kept with the services' logs; default a temporary one, removed when the run passes")
)

// TestChaos runs the chaos suite against a private PostgreSQL cluster and
// NATS server with real relay and consumer processes. In short mode (the
// default, run by make test) it does two short runs: seed 1 and a random seed
// printed for reruns. With -chaos.duration it does one run of that length.
func TestChaos(t *testing.T) {
	if _, err := os.Stat(pgBinDir + "/initdb"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("chaos: needs PostgreSQL server binaries in %s: %v", pgBinDir, err)
		}
		t.Skipf("chaos: needs PostgreSQL server binaries in %s", pgBinDir)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if d, ok := t.Deadline(); ok {
		ctx, cancel = context.WithDeadline(ctx, d.Add(-30*time.Second))
		defer cancel()
	}
	type runSpec struct {
		name     string
		seed     uint64
		duration time.Duration
	}
	var runs []runSpec
	switch {
	case *flagDuration > 0:
		seed := *flagSeed
		if seed == 0 {
			seed = rand.Uint64N(1<<31) + 2
		}
		runs = []runSpec{{"long", seed, *flagDuration}}
	case *flagSeed != 0:
		runs = []runSpec{{"seeded", *flagSeed, 60 * time.Second}}
	default:
		runs = []runSpec{{"fixed-seed", 1, 60 * time.Second}, {"random-seed", rand.Uint64N(1<<31) + 2, 25 * time.Second}}
	}
	binDir := binaries(t)
	for _, spec := range runs {
		t.Run(spec.name, func(t *testing.T) {
			t.Logf("chaos seed %d (rerun: make chaos SEED=%d)", spec.seed, spec.seed)
			rep, err := Run(ctx, Config{
				Seed: spec.seed, Duration: spec.duration, BinDir: binDir, WorkDir: *flagWorkDir, Out: testWriter{t},
			})
			if err != nil {
				t.Fatalf("seed %d: %v", spec.seed, err)
			}
			if rep.Produced == 0 || rep.Credits == 0 || len(rep.Faults) == 0 {
				t.Fatalf("seed %d: the run proved nothing: %d events, %d credits, %d fault kinds", spec.seed, rep.Produced, rep.Credits, len(rep.Faults))
			}
		})
	}
}

func TestMain(m *testing.M) {
	flag.Parse()
	code := m.Run()
	if testBinaries.dir != "" {
		_ = os.RemoveAll(testBinaries.dir)
	}
	os.Exit(code)
}

// testWriter sends the run's output to the test log, line by line.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(string(trimNL(p)))
	return len(p), nil
}

func trimNL(p []byte) []byte {
	for len(p) > 0 && p[len(p)-1] == '\n' {
		p = p[:len(p)-1]
	}
	return p
}
