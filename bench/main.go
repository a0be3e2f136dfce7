// Command bench measures pgrelay's throughput, latency, scale and cost against
// floors measured on the same machine in the same run: the same work done with
// plain SQL through pgx. It prints a table of every figure next to its floor
// and the ratio, and writes results.json, results.txt and results.svg to the
// output directory.
//
//	go run ./bench                 # the full run (about ten minutes)
//	go run ./bench -quick          # a small run that proves it works
//
// The benchmark never fails on a figure: it exits non-zero only when it cannot
// run (no database, bad settings).
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/pgrelay/pgrelay/internal/cli"
	"github.com/pgrelay/pgrelay/internal/pgurl"
)

func main() {
	exitIfMinimal()
	if err := mainErr(); err != nil {
		msg := err.Error()
		if !strings.HasPrefix(msg, "bench:") {
			msg = "bench: " + msg
		}
		fmt.Fprintln(os.Stderr, msg)
		os.Exit(1)
	}
}

func mainErr() error {
	if err := cli.ValidateEnv(map[string]string{"BENCH_QUICK": "bool"}); err != nil {
		return err
	}
	var cfg Config
	var loads, costLoads, relays, only, logLevel, cpuProfile string
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.StringVar(&cfg.DatabaseURL, "database-url", cli.EnvString("BENCH_DATABASE_URL", cli.EnvString("DATABASE_URL", os.Getenv("TEST_DATABASE_URL"))),
		"PostgreSQL server (maintenance database) where the run creates and drops its databases (BENCH_DATABASE_URL, else DATABASE_URL, else TEST_DATABASE_URL)")
	fs.StringVar(&cfg.NATSURL, "nats-url", os.Getenv("NATS_URL"), "NATS JetStream server (NATS_URL); empty starts one in-process")
	fs.StringVar(&cfg.Broker, "broker", cli.EnvString(cli.BrokerEnv, "nats"), "broker the relay drains publish to (PGRELAY_BROKER): nats; rabbitmq (AMQP_URL, default the local server) kafka (-kafka-brokers) or postgres (a fresh target database on the same server) with -only relay")
	var kafkaBrokers string
	fs.StringVar(&kafkaBrokers, "kafka-brokers", os.Getenv("KAFKA_BROKERS"), "Kafka brokers host:port,... for -broker kafka (KAFKA_BROKERS); empty starts kfake, franz-go's in-process fake Kafka")
	fs.StringVar(&cfg.OutDir, "out", "bench-results", "output directory")
	fs.BoolVar(&cfg.Quick, "quick", cli.EnvBool("BENCH_QUICK", false), "small sizes and one repeat: proves the benchmark runs (BENCH_QUICK)")
	fs.IntVar(&cfg.Repeats, "repeats", 0, "repeats per figure (default 3, quick 1)")
	fs.IntVar(&cfg.Events, "events", 0, "backlog size of the drains and events per end-to-end run (default 10000, quick 1000)")
	fs.IntVar(&cfg.BatchSize, "batch", 0, "events per transaction of the floors and the batched producers (default 100)")
	fs.IntVar(&cfg.Workers, "workers", 0, "connections of the floors and producers (default 4)")
	fs.IntVar(&cfg.Prefill, "prefill", 0, "finished rows prefilled for the scale figures (default 1000000, quick 20000)")
	fs.DurationVar(&cfg.LoadDuration, "load-duration", 0, "duration of each fixed-load latency run (default 10s, quick 2s)")
	fs.DurationVar(&cfg.TunedMaxWait, "tuned-max-wait", 0, "consumer fetch wait of the extra latency run at the first load (default 10ms, quick: skipped; a negative duration such as -1s skips it)")
	fs.StringVar(&loads, "loads", "", "comma-separated offered loads in events/s (default 500,5000; quick 200)")
	fs.StringVar(&costLoads, "cost-loads", "", "comma-separated offered loads of the cost group in events/s (default 500,2000,5000; quick 200)")
	fs.BoolVar(&cfg.CostStatements, "cost-statements", false, "cost group: load pg_stat_statements and print each load's statements per event (costs the server CPU)")
	fs.StringVar(&cfg.CostCapture, "cost-capture", "", "cost group: only this capture mode: table, wal or minimal, the floor pipeline (default all three)")
	costFloor := fs.Bool("cost-floor", true, "cost group: measure the combined floor on its cluster first")
	fs.IntVar(&cfg.RelayDatabases, "relay-databases", 0, "databases of the relay group's many-databases drain, -events rows each, drained by one relay at once (default 10)")
	fs.StringVar(&relays, "relays", "", "comma-separated relay instance counts (default 1,2,4; quick 1,2)")
	fs.StringVar(&only, "only", "", "comma-separated groups to run: floor, producer, relay, inbox, inbox-ordered, e2e, scale, cost (default all), and wal and horizon (only when named: each starts a private cluster)")
	fs.DurationVar(&cfg.Timeout, "timeout", 0, "limit of each single measurement (default 5m, quick 1m)")
	fs.StringVar(&cfg.BinDir, "bin", "", "directory with prebuilt relay and consumer binaries (default: go build them)")
	fs.IntVar(&cfg.HorizonRate, "horizon-rate", 0, "steady load of the horizon group in events/s (default 1000, quick 200)")
	fs.DurationVar(&cfg.HorizonHold, "horizon-hold", 0, "how long the horizon group holds the xmin horizon (default 10m, quick 20s)")
	fs.DurationVar(&cfg.HorizonAfter, "horizon-after", 0, "how long the horizon group's load goes on after the release (default 2m, quick 20s)")
	fs.DurationVar(&cfg.HorizonSample, "horizon-sample", 0, "sampling interval of the horizon group (default 10s, quick 2s)")
	fs.StringVar(&cfg.Observer, "observer", "auto", "how the end-to-end runs time each event's ledger credit: poll (a 1 ms ledger poll), commit-ts (the crediting transaction's commit timestamp; needs track_commit_timestamp = on) or auto (commit-ts when the server has it on and runs on this machine)")
	fs.StringVar(&logLevel, "log-level", "warn", "log level of the benchmark and the in-process services")
	fs.BoolVar(&cfg.SQLTrace, "sql-trace", false, "count the in-process services' statements (round trips) by kind and print them after each end-to-end run; with services in-process only")
	fs.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run (in-process services included) to this file, for go tool pprof")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return err
	}
	var err error
	if cfg.Loads, err = parseInts("-loads", loads); err != nil {
		return err
	}
	cfg.CostNoFloor = !*costFloor
	if cfg.CostLoads, err = parseInts("-cost-loads", costLoads); err != nil {
		return err
	}
	if cfg.RelayInstances, err = parseInts("-relays", relays); err != nil {
		return err
	}
	if kafkaBrokers != "" {
		cfg.KafkaBrokers = strings.Split(kafkaBrokers, ",")
	}
	if only != "" {
		cfg.Only = strings.Split(only, ",")
	}
	if cfg.Logger, err = cli.NewLogger(logLevel, "console"); err != nil {
		return err
	}
	if cpuProfile != "" {
		f, err := os.Create(cpuProfile)
		if err != nil {
			return fmt.Errorf("-cpuprofile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("-cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}

	ctx, cancel := cli.SignalContext(context.Background())
	defer cancel()
	res, err := Run(ctx, cfg)
	if err != nil {
		return err
	}
	fmt.Print(renderTable(res))
	cfg = cfg.WithDefaults()
	fmt.Printf("\nwritten to %s/ (results.json, results.txt, results.svg)\n", cfg.OutDir)
	return nil
}

func parseInts(flagName, s string) ([]int, error) {
	if s == "" {
		return nil, nil
	}
	var out []int
	for _, part := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(part))
		if err != nil {
			return nil, fmt.Errorf("invalid %s %q: want comma-separated integers", flagName, s)
		}
		out = append(out, n)
	}
	return out, nil
}

// bench is one run's state.
type bench struct {
	cfg  Config
	log  *slog.Logger
	dbs  *databases
	res  *Results
	nats *natsEnv
	// kafka is the Kafka cluster of -broker kafka, else nil.
	kafka *kafkaEnv
	// bins are the relay and consumer binaries; nil runs the services in
	// this process instead (labelled so in the results).
	bins *binaries
}

// Run measures every selected group and writes the results. It returns an
// error only when the benchmark cannot run at all; a measurement that fails
// is recorded in its figures and the run goes on.
func Run(ctx context.Context, cfg Config) (*Results, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	b := &bench{cfg: cfg, log: cfg.Logger, res: &Results{Started: time.Now().UTC(), Quick: cfg.Quick, Machine: describeMachine()}}
	b.res.Settings = map[string]any{
		"repeats": cfg.Repeats, "events": cfg.Events, "batch_size": cfg.BatchSize, "workers": cfg.Workers,
		"prefill": cfg.Prefill, "load_duration": cfg.LoadDuration.String(), "loads": cfg.Loads,
		"relay_instances": cfg.RelayInstances, "relay_databases": cfg.RelayDatabases, "only": cfg.Only, "tuned_max_wait": cfg.TunedMaxWait.String(),
		"broker": cfg.Broker,
	}
	if err := os.MkdirAll(cfg.OutDir, 0o755); err != nil {
		return nil, fmt.Errorf("output directory (-out): %w", err)
	}

	setupCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	version, settings, err := postgresSettings(setupCtx, cfg.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL at %s (-database-url): %w", pgurl.Redact(cfg.DatabaseURL), err)
	}
	b.res.Machine.Postgres, b.res.Postgres = version, settings
	b.dbs, err = newDatabases(setupCtx, cfg.DatabaseURL, b.log)
	if b.dbs != nil {
		defer b.dbs.dropAll()
	}
	if err != nil {
		return nil, err
	}
	b.nats, err = startNATS(setupCtx, cfg.NATSURL, b.log)
	if err != nil {
		return nil, err
	}
	defer b.nats.close()
	b.res.Machine.NATS, b.res.Machine.NATSServer = b.nats.version, b.nats.where
	if cfg.Broker == "kafka" {
		b.kafka, err = startKafka(cfg.KafkaBrokers, b.log)
		if err != nil {
			return nil, err
		}
		defer b.kafka.close()
		b.res.Settings["kafka"] = b.kafka.where
	}

	b.res.Settings["services"] = "not needed"
	if cfg.runs("e2e") || cfg.runs("cost") {
		bins, err := buildBinaries(setupCtx, cfg.BinDir)
		if err != nil {
			b.log.Warn("services run in-process: no binaries", slog.Any("error", err))
			b.res.Settings["services"] = "in-process (" + err.Error() + ")"
		} else {
			defer bins.remove()
			b.bins = bins
			b.res.Settings["services"] = "processes: cmd/relay and cmd/consumer"
		}
	}

	if cfg.runs("e2e") || cfg.runs("cost") {
		if _, err := b.observerFor(b.dbs); err != nil {
			return nil, err
		}
		b.res.Settings["observer"] = b.describeObserver(b.dbs)
	}
	b.declareFigures()
	for _, g := range allGroups {
		if !cfg.runs(g) || ctx.Err() != nil {
			continue
		}
		b.log.Info("group", slog.String("group", g))
		b.runGroup(ctx, g)
	}
	b.res.Finished = time.Now().UTC()
	b.res.finish()
	if err := writeResults(cfg.OutDir, b.res); err != nil {
		return b.res, err
	}
	if ctx.Err() != nil {
		return b.res, fmt.Errorf("interrupted: %w", ctx.Err())
	}
	return b.res, nil
}
