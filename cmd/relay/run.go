package main

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/spf13/cobra"

	"github.com/pgrelay/pgrelay/internal/admin/admincli"
	"github.com/pgrelay/pgrelay/internal/cli"
	"github.com/pgrelay/pgrelay/internal/endpoints"
	"github.com/pgrelay/pgrelay/internal/otelenv"
	"github.com/pgrelay/pgrelay/internal/setting"
	"github.com/pgrelay/pgrelay/internal/tui"
	"github.com/pgrelay/pgrelay/migrations"
	"github.com/pgrelay/pgrelay/otelpgrelay"
	"github.com/pgrelay/pgrelay/relay"
)

// settings are the command line, each defaulted from its environment variable.
type settings struct {
	databaseURL  string
	broker       string
	brokers      map[string]cli.RelaySide
	wire         cli.Wire
	nodeID       string
	batchSize    int
	lease        time.Duration
	heartbeat    time.Duration
	pollInterval time.Duration
	// pollIntervalSet: --poll-interval or RELAY_POLL_INTERVAL was given.
	pollIntervalSet    bool
	publishTimeout     time.Duration
	retention          time.Duration
	retentionInterval  time.Duration
	retentionBatchSize int
	capture            string
	walSlot            string
	walUnbounded       bool
	walTruncate        time.Duration
	migrate            bool
	asyncMarks         bool
	standbyNames       string
	logLevel           string
	logFormat          string
	ops                endpoints.Flags
	db                 cli.DBSettings
}

// The operator endpoints' default addresses (the consumer's are one above).
const (
	defaultMetricsAddr = ":9090"
	defaultAdminAddr   = "127.0.0.1:9190"
)

// envKinds lists the typed environment variables, checked at start-up.
var envKinds = map[string]string{
	"RELAY_BATCH_SIZE":               "int",
	"RELAY_LEASE":                    "duration",
	"RELAY_HEARTBEAT":                "duration",
	"RELAY_POLL_INTERVAL":            "duration",
	"RELAY_PUBLISH_TIMEOUT":          "duration",
	"RELAY_RETENTION":                "duration",
	"RELAY_RETENTION_INTERVAL":       "duration",
	"RELAY_RETENTION_BATCH":          "int",
	"RELAY_MIGRATE":                  "bool",
	"RELAY_WAL_ALLOW_UNBOUNDED_SLOT": "bool",
	"RELAY_WAL_TRUNCATE_INTERVAL":    "duration",
	"RELAY_ASYNC_MARKS":              "bool",
}

// flagOf names the flag and environment variable that fill each relay.Config
// field, so that validation errors name what the user sets.
var flagOf = map[string]string{
	"BatchSize":             "--batch-size (RELAY_BATCH_SIZE)",
	"Lease":                 "--lease (RELAY_LEASE)",
	"HeartbeatInterval":     "--heartbeat (RELAY_HEARTBEAT)",
	"PollInterval":          "--poll-interval (RELAY_POLL_INTERVAL)",
	"PublishTimeout":        "--publish-timeout (RELAY_PUBLISH_TIMEOUT)",
	"RetentionInterval":     "--retention-interval (RELAY_RETENTION_INTERVAL)",
	"RetentionBatchSize":    "--retention-batch (RELAY_RETENTION_BATCH)",
	"MetricsAddr":           "--metrics-addr (METRICS_ADDR)",
	"AdminAddr":             "--admin-addr (ADMIN_ADDR)",
	"AdminToken":            "--admin-token (ADMIN_TOKEN)",
	"Pool":                  "--database-url (DATABASE_URL)",
	"Capture":               "--capture (RELAY_CAPTURE)",
	"WALSlot":               "--wal-slot (RELAY_WAL_SLOT)",
	"WALAllowUnboundedSlot": "--wal-allow-unbounded-slot (RELAY_WAL_ALLOW_UNBOUNDED_SLOT)",
	"WALTruncateInterval":   "--wal-truncate-interval (RELAY_WAL_TRUNCATE_INTERVAL)",
	"StandbyNames":          "--standby-names (RELAY_STANDBY_NAMES)",
}

// nameSettings spells the relay.Config fields of err's *setting.FieldErrors
// as the settings the user sets, without the relay package's prefix: main
// prefixes the command's name ("relay: relay: ..." would say it twice).
func nameSettings(err error) error {
	return setting.Map(err, func(fe *setting.FieldError) error {
		if fe.Struct != "relay.Config" {
			return fe // a broker adapter's, named by its side already
		}
		return setting.Name(fe, func(field string) string { return flagOf[field] })
	})
}

func newRootCommand() *cobra.Command {
	var s settings
	root := &cobra.Command{
		Use:   "relay",
		Short: "Publish committed outbox rows to a message broker (NATS JetStream by default)",
		Long: `relay publishes the rows applications commit into the pgrelay outbox table to
a message broker (--broker: NATS JetStream by default), in commit order per
key, then marks them published.

Several relays can run against one database: they share the outbox partitions
through leases, and a relay that crashes has its partitions taken over when its
leases expire. A relay that lost a partition cannot mark its rows (fencing).

With --broker nats, every event is published to <subject-prefix>.<topic> with
the event id as JetStream's dedup id (Nats-Msg-Id) and its metadata in
Pgrelay-* headers.`,
		SilenceUsage: true,
		// main prints the error once, prefixed with the command's name.
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&s.databaseURL, "database-url", cli.EnvString("DATABASE_URL", ""), "PostgreSQL URL of the database holding the outbox (env DATABASE_URL); required")

	run := &cobra.Command{
		Use:   "run",
		Short: "Relay outbox rows until SIGTERM or SIGINT",
		Long: `Relay outbox rows until SIGTERM or SIGINT. On a signal the relay finishes the
batches in flight, releases its partition leases and notifies the other relays
(channel pgrelay_relays), which take the partitions over at once, and exits.

With --broker nats (the default) and without --nats-url, an embedded NATS
server with JetStream is started in this process (data in --embedded-nats-dir,
listening on --embedded-nats-listen) and the stream is created, so a first run
needs only PostgreSQL.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, env := os.LookupEnv("RELAY_POLL_INTERVAL")
			s.pollIntervalSet = env || cmd.Flags().Changed("poll-interval")
			return runRelay(cmd.Context(), s)
		},
	}
	f := run.Flags()
	brokers := cli.Brokers()
	cli.BindBrokerFlag(f, &s.broker, brokers)
	s.brokers = cli.BindRelaySides(f, brokers)
	cli.BindWireFlags(f, &s.wire)
	f.StringVar(&s.nodeID, "node-id", cli.EnvString("RELAY_NODE_ID", ""), "unique name of this relay in the lease table (env RELAY_NODE_ID); default <hostname>-<pid>-<random>")
	f.IntVar(&s.batchSize, "batch-size", cli.EnvInt("RELAY_BATCH_SIZE", relay.DefaultBatchSize), "rows published and marked at once per partition, 1-10000 (env RELAY_BATCH_SIZE)")
	f.DurationVar(&s.lease, "lease", cli.EnvDuration("RELAY_LEASE", relay.DefaultLease), "partition lease duration: a crashed relay's partitions move after it, or about a second after its lock session ends (docs/relay.md) (env RELAY_LEASE)")
	f.DurationVar(&s.heartbeat, "heartbeat", cli.EnvDuration("RELAY_HEARTBEAT", 0), "lease renewal and rebalancing interval, at most lease/2 (env RELAY_HEARTBEAT); default lease/3")
	f.DurationVar(&s.pollInterval, "poll-interval", cli.EnvDuration("RELAY_POLL_INTERVAL", relay.DefaultPollInterval), "fallback poll of idle partitions; LISTEN/NOTIFY wakes them sooner (env RELAY_POLL_INTERVAL)")
	f.DurationVar(&s.publishTimeout, "publish-timeout", cli.EnvDuration("RELAY_PUBLISH_TIMEOUT", relay.DefaultPublishTimeout), "longest time to publish one batch and collect its acknowledgements (env RELAY_PUBLISH_TIMEOUT)")
	f.DurationVar(&s.retention, "retention", cli.EnvDuration("RELAY_RETENTION", relay.DefaultRetention), "how long published rows are kept; negative keeps them forever; dead rows are always kept (env RELAY_RETENTION)")
	f.DurationVar(&s.retentionInterval, "retention-interval", cli.EnvDuration("RELAY_RETENTION_INTERVAL", relay.DefaultRetentionInterval), "how often expired published rows are deleted (env RELAY_RETENTION_INTERVAL)")
	f.IntVar(&s.retentionBatchSize, "retention-batch", cli.EnvInt("RELAY_RETENTION_BATCH", relay.DefaultRetentionBatchSize), "rows deleted per retention statement (env RELAY_RETENTION_BATCH)")
	f.StringVar(&s.capture, "capture", cli.EnvString("RELAY_CAPTURE", "table"), "where events are read from: table (the outbox table) or wal (events written with pgrelay.Emit, read from a logical replication slot; docs/wal.md) (env RELAY_CAPTURE)")
	f.StringVar(&s.walSlot, "wal-slot", cli.EnvString("RELAY_WAL_SLOT", "pgrelay"), "replication slot of --capture wal; one relay streams it, the others wait as standbys (env RELAY_WAL_SLOT)")
	f.BoolVar(&s.walUnbounded, "wal-allow-unbounded-slot", cli.EnvBool("RELAY_WAL_ALLOW_UNBOUNDED_SLOT", false), "create the slot even while max_slot_wal_keep_size is -1 (unlimited) (env RELAY_WAL_ALLOW_UNBOUNDED_SLOT)")
	f.DurationVar(&s.walTruncate, "wal-truncate-interval", cli.EnvDuration("RELAY_WAL_TRUNCATE_INTERVAL", 0), "how often the streaming relay of --capture wal empties pgrelay.outbox_wal with TRUNCATE; negative: never (env RELAY_WAL_TRUNCATE_INTERVAL); default 1m")
	f.BoolVar(&s.asyncMarks, "async-marks", cli.EnvBool("RELAY_ASYNC_MARKS", false), "let each batch's published mark commit without waiting for its WAL flush; a mark a server crash loses only republishes its rows, deduplicated (env RELAY_ASYNC_MARKS)")
	f.StringVar(&s.standbyNames, "standby-names", cli.EnvString("RELAY_STANDBY_NAMES", ""), "publish a row only once every standby named (application_name, comma-separated) has flushed its commit: no event from a commit a failover loses; none connected, nothing is published (docs/operations.md, Failover) (env RELAY_STANDBY_NAMES)")
	f.BoolVar(&s.migrate, "migrate", cli.EnvBool("RELAY_MIGRATE", false), "apply pending database migrations before relaying (env RELAY_MIGRATE)")
	f.StringVar(&s.logLevel, "log-level", cli.EnvString("LOG_LEVEL", "info"), "debug, info, warn or error (env LOG_LEVEL)")
	f.StringVar(&s.logFormat, "log-format", cli.EnvString("LOG_FORMAT", "json"), "json or console (env LOG_FORMAT)")

	cli.BindEndpointFlags(f, &s.ops, defaultMetricsAddr, defaultAdminAddr, false)
	cli.BindDBFlags(f, &s.db, "--lease")

	root.AddCommand(run, cli.MigrateCommand(&s.databaseURL), healthCommand())
	root.AddCommand(admincli.Commands(&s.databaseURL)...)
	root.AddCommand(tui.Command("relay", &s.databaseURL))
	return root
}

// runRelay validates the settings, connects, and relays until ctx or a
// signal ends it.
// defaultPartitions is the outbox's partition count in a default install
// (pgrelay.outbox_partition_count()).
const defaultPartitions = 16

func runRelay(parent context.Context, s settings) error {
	if err := cli.ValidateEnv(envKinds); err != nil {
		return err
	}
	if err := cli.ValidateEnv(cli.DBEnvKinds); err != nil {
		return err
	}
	if s.databaseURL == "" {
		return errors.New("--database-url (DATABASE_URL) is required")
	}
	side, err := cli.SelectBroker(s.broker, s.brokers)
	if err != nil {
		return err
	}
	if err := cli.ApplyWire(side, s.broker, s.wire); err != nil {
		return err
	}
	if d, ok := side.(cli.DatabaseDefault); ok {
		d.DefaultDatabase(s.databaseURL)
	}
	if err := side.Check(); err != nil {
		return err
	}
	log, err := cli.NewLogger(s.logLevel, s.logFormat)
	if err != nil {
		return err
	}
	// OTEL_* environment variables; none set: no tracing (docs/tracing.md).
	tp, err := otelenv.New(parent, "pgrelay-relay")
	if err != nil {
		return err
	}
	if tp != nil {
		// Flushed at exit, after the relay stopped publishing.
		defer shutdownTracing(tp, log)
	}
	rcfg := relay.Config{
		Logger: log, NodeID: s.nodeID,
		BatchSize: s.batchSize, Lease: s.lease, HeartbeatInterval: s.heartbeat,
		PollInterval: s.pollInterval, PublishTimeout: s.publishTimeout,
		Retention: s.retention, RetentionInterval: s.retentionInterval, RetentionBatchSize: s.retentionBatchSize,
		AsyncMarks: s.asyncMarks, StandbyNames: splitNames(s.standbyNames),
		MetricsAddr: s.ops.MetricsAddr, AdminAddr: s.ops.AdminAddr, AdminToken: s.ops.AdminToken,
		Capture: s.capture, WALSlot: s.walSlot, WALAllowUnboundedSlot: s.walUnbounded,
		WALTruncateInterval: s.walTruncate,
	}
	if err := rcfg.Validate(); err != nil {
		return nameSettings(err)
	}
	lease := rcfg.Lease
	if lease == 0 {
		lease = relay.DefaultLease
	}
	dbs, err := s.db.Resolve(lease, 0)
	if err != nil {
		return err
	}
	if rcfg.ListenConnConfig, rcfg.NoListen, err = dbs.Listen(); err != nil {
		return err
	}
	if rcfg.NoListen && !s.pollIntervalSet {
		rcfg.PollInterval = cli.PoolerPollInterval
	}

	ctx, stop := cli.SignalContext(parent)
	defer stop()

	startCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// Enough connections for one relay owning every partition of a default
	// install (16): its partition workers read and mark at once (the LISTEN
	// connection is dialled beside the pool). pgxpool opens them only as
	// needed.
	pool, err := cli.OpenPool(startCtx, s.databaseURL, dbs, int32(relay.PoolConns(defaultPartitions)))
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := dbs.Reach(startCtx, pool); err != nil {
		return err
	}
	if s.migrate {
		if err := cli.MigrateUp(startCtx, s.databaseURL); err != nil {
			return err
		}
	}
	sqlDB := stdlib.OpenDBFromPool(pool)
	err = migrations.Check(startCtx, sqlDB)
	_ = sqlDB.Close()
	if err != nil {
		// Relaying on a partial schema would only loop on errors.
		return cli.SchemaError(err, "apply the migrations first: relay migrate up (or relay run --migrate)")
	}

	bc, err := side.Open(startCtx, log)
	if err != nil {
		return err
	}
	defer bc.Close()
	pub := bc.Publisher
	if tp != nil {
		pub = otelpgrelay.NewPublisher(pub, otelpgrelay.WithTracerProvider(tp), otelpgrelay.WithSystem(s.broker))
	}

	rcfg.Pool, rcfg.Publisher, rcfg.BrokerCheck = pool, pub, bc.Healthy
	r, err := relay.New(rcfg)
	if err != nil {
		return nameSettings(err)
	}
	cancel()
	return nameSettings(r.Run(ctx))
}

// splitNames splits a comma-separated list, each name trimmed; "" is none.
func splitNames(list string) []string {
	if strings.TrimSpace(list) == "" {
		return nil
	}
	names := strings.Split(list, ",")
	for i, n := range names {
		names[i] = strings.TrimSpace(n)
	}
	return names
}

// shutdownTracing flushes the spans still buffered, waiting 5s at most.
func shutdownTracing(tp *otelenv.Provider, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := tp.Shutdown(ctx); err != nil {
		log.Warn("flush traces", slog.Any("error", err))
	}
}
