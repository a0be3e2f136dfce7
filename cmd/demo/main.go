// Command demo runs pgrelay end to end on this machine and verifies the
// result: orders written with their events in business transactions, the
// relay and the consumer as real processes (killed with SIGKILL mid-run and
// restarted), duplicates, poison and out-of-order events injected into NATS,
// and a ledger that must match the shop to the cent. It needs only
// PostgreSQL: without NATS_URL it starts an embedded NATS JetStream server.
//
//	make demo                 # builds the binaries, then runs bin/demo
//	bin/demo --short          # the quick version CI runs
//
// It exits with status 1 when the verification fails.
package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgrelay/pgrelay/internal/cli"
	"github.com/pgrelay/pgrelay/internal/demo"
)

func main() {
	var cfg demo.Config
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run pgrelay end to end with crashes, duplicates and poison, then verify the ledger",
		Long: `demo creates its own database, applies the migrations, starts the relay and
the consumer as real processes, produces orders with their OrderCreated and
OrderPaid events in business transactions, injects duplicate deliveries, poison
messages and out-of-order events straight into NATS, kills both services with
SIGKILL mid-run and restarts them, and finally checks that every paid order was
credited exactly once and that nothing was lost. Exit status 1 means a check
failed.`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cli.ValidateEnv(map[string]string{"DEMO_ORDERS": "int", "DEMO_TIMEOUT": "duration"}); err != nil {
				return err
			}
			ctx, stop := cli.SignalContext(cmd.Context())
			defer stop()
			cfg.Out = cmd.OutOrStdout()
			_, err := demo.Run(ctx, cfg)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.DatabaseURL, "database-url", cli.EnvString("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"), "PostgreSQL server; the demo creates its own database there (DATABASE_URL)")
	f.StringVar(&cfg.Database, "database", cli.EnvString("DEMO_DATABASE", "pgrelay_demo"), "the demo's database, dropped and recreated on each run (DEMO_DATABASE)")
	f.BoolVar(&cfg.DropDatabase, "drop-database", false, "drop the demo's database at the end instead of keeping it for inspection")
	f.StringVar(&cfg.NATSURL, "nats-url", cli.EnvString("NATS_URL", ""), "NATS JetStream server; empty starts an embedded one (NATS_URL)")
	f.StringVar(&cfg.Broker, "broker", cli.EnvString("PGRELAY_BROKER", "nats"), "broker of the run: nats, rabbitmq, postgres, or kafka (kfake, an in-memory Kafka the demo starts) (PGRELAY_BROKER)")
	f.StringVar(&cfg.AMQPURL, "amqp-url", cli.EnvString("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"), "RabbitMQ server of a --broker rabbitmq run; the demo uses exchange and queues of its own (AMQP_URL)")
	f.StringVar(&cfg.BinDir, "bin-dir", "", "directory holding the relay and consumer binaries (default: next to this binary, then PATH)")
	f.StringVar(&cfg.WorkDir, "work-dir", "", "directory for the services' logs and embedded NATS data (default: a new temporary directory)")
	f.StringVar(&cfg.Capture, "capture", cli.EnvString("DEMO_CAPTURE", "table"), "the relay's capture: table (producers Enqueue into the outbox) or wal (producers Emit to the WAL; needs wal_level = logical, else the demo starts a private cluster when PostgreSQL's server binaries are installed; docs/wal.md) (DEMO_CAPTURE)")
	f.BoolVar(&cfg.Short, "short", false, "a smaller, faster run (for CI)")
	f.IntVar(&cfg.Orders, "orders", cli.EnvInt("DEMO_ORDERS", 0), "orders to produce (default 2000, or 300 with --short) (DEMO_ORDERS)")
	f.DurationVar(&cfg.Timeout, "timeout", cli.EnvDuration("DEMO_TIMEOUT", 90*time.Second), "longest wait for the pipeline to drain (DEMO_TIMEOUT)")
	if err := cmd.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}
