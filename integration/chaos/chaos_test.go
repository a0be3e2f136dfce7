package chaos

import (
	"context"
	"flag"
	"math/rand/v2"
	"net"
	"os"
	"testing"
	"time"
)

var (
	flagDuration = flag.Duration("chaos.duration", 0, "fault phase of one long run (e.g. 20m); 0 runs the short CI mode: a fixed seed and a random one")
	flagSeed     = flag.Uint64("chaos.seed", 0, "seed of the run; 0 picks a random one (printed)")
	flagWorkDir  = flag.String("chaos.workdir", "", "directory kept with the services' logs; default a temporary one, removed when the run passes")
	flagOrdered  = flag.Bool("chaos.ordered", false, "run the consumers with --ordered and check each key's apply order (the short CI mode's random-seed run always does)")
	flagBroker   = flag.String("chaos.broker", "", "broker of the runs: nats, rabbitmq or postgres (RabbitMQ at AMQP_URL, default the local one, restarted with rabbitmqctl); empty: the short CI mode's NATS runs and a short RabbitMQ and PostgreSQL run each")
)

// TestChaos runs the chaos suite against a private PostgreSQL cluster and a
// broker with real relay and consumer processes. In short mode (the default,
// run by make test) it does two short NATS runs, seed 1 and a random seed
// printed for reruns, and a shorter RabbitMQ run (without RabbitMQ restarts:
// the server is shared with other tests). With -chaos.duration it does one run
// of that length; -chaos.broker picks the broker of every run.
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
		broker   string
		ordered  bool
	}
	// An explicit -chaos.broker rabbitmq run may restart RabbitMQ.
	restart := *flagBroker == BrokerRabbitMQ
	var runs []runSpec
	switch {
	case *flagDuration > 0:
		seed := *flagSeed
		if seed == 0 {
			seed = rand.Uint64N(1<<31) + 2
		}
		runs = []runSpec{{"long", seed, *flagDuration, *flagBroker, *flagOrdered}}
	case *flagSeed != 0:
		runs = []runSpec{{"seeded", *flagSeed, 60 * time.Second, *flagBroker, *flagOrdered}}
	case *flagBroker != "":
		runs = []runSpec{{"fixed-seed", 1, 60 * time.Second, *flagBroker, *flagOrdered},
			{"random-seed", rand.Uint64N(1<<31) + 2, 25 * time.Second, *flagBroker, true}}
	default:
		runs = []runSpec{{"fixed-seed", 1, 60 * time.Second, BrokerNATS, *flagOrdered},
			{"random-seed", rand.Uint64N(1<<31) + 2, 25 * time.Second, BrokerNATS, true},
			{"rabbitmq", rand.Uint64N(1<<31) + 2, 20 * time.Second, BrokerRabbitMQ, *flagOrdered},
			{"postgres", rand.Uint64N(1<<31) + 2, 20 * time.Second, BrokerPostgres, true}}
	}
	amqpURL := os.Getenv("AMQP_URL")
	binDir := binaries(t)
	for _, spec := range runs {
		t.Run(spec.name, func(t *testing.T) {
			if spec.broker == BrokerRabbitMQ {
				requireRabbitMQ(t, amqpURL)
			}
			t.Logf("chaos seed %d on %s (rerun: make chaos SEED=%d BROKER=%s)", spec.seed, spec.broker, spec.seed, spec.broker)
			rep, err := Run(ctx, Config{
				Seed: spec.seed, Duration: spec.duration, BinDir: binDir, WorkDir: *flagWorkDir, Out: testWriter{t},
				Broker: spec.broker, AMQPURL: amqpURL, BrokerRestart: restart, Ordered: spec.ordered,
			})
			if err != nil {
				t.Fatalf("seed %d: %v", spec.seed, err)
			}
			if spec.ordered && rep.OrderedKeys == 0 {
				t.Fatalf("seed %d: an ordered run checked no key's apply order", spec.seed)
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
	testBinaries.Remove()
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

// requireRabbitMQ skips the test without a RabbitMQ server at u (default the
// local one), or fails it under CI.
func requireRabbitMQ(t *testing.T, u string) {
	t.Helper()
	if u == "" {
		u = "amqp://guest:guest@127.0.0.1:5672/"
	}
	host, err := amqpHost(u)
	if err != nil {
		t.Fatalf("AMQP_URL: %v", err)
	}
	c, err := net.DialTimeout("tcp", host, 2*time.Second)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("chaos: needs RabbitMQ at %s: %v", host, err)
		}
		t.Skipf("chaos: needs RabbitMQ at %s (set AMQP_URL or start rabbitmq-server): %v", host, err)
	}
	_ = c.Close()
}
