package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgrelay/pgrelay/internal/admin/admincli"
	"github.com/pgrelay/pgrelay/internal/cli"
	"github.com/pgrelay/pgrelay/internal/endpoints"
	"github.com/pgrelay/pgrelay/internal/otelenv"
	"github.com/pgrelay/pgrelay/internal/pgurl"
	"github.com/pgrelay/pgrelay/internal/tui"
	"github.com/pgrelay/pgrelay/otelpgrelay"
	"github.com/pgrelay/pgrelay/relay"
)

// settings are the command line, each defaulted from its environment variable.
type settings struct {
	databaseURL string
	// databaseURLs are relay run's --database-url, databasesFile and
	// maxConnsTotal its other database settings (databases.go).
	databaseURLs  []string
	databasesFile string
	maxConnsTotal int
	urls          *urlList
	names         dbNames
	broker        string
	brokers       map[string]cli.RelaySide
	wire          cli.Wire
	// cfg holds the relay.Config fields the options set.
	cfg          relay.Config
	migrate      bool
	standbyNames string
	logLevel     string
	logFormat    string
	ops          endpoints.Flags
	db           cli.DBSettings
}

// The operator endpoints' default addresses (the consumer's are one above).
const (
	defaultMetricsAddr = ":9090"
	defaultAdminAddr   = "127.0.0.1:9190"
)

// options lists the settings of relay run: every flag name and environment
// variable is written here once.
func options(s *settings) cli.Options {
	c := &s.cfg
	return append(cli.Options{
		cli.Opt("database-url", "DATABASE_URL", "Pool", s.urls, "", "PostgreSQL URL of a database holding an outbox; relay run: repeatable, each named by its database name"),
		cli.Opt("databases-file", "RELAY_DATABASES_FILE", "Databases", &s.databasesFile, "", "file naming databases to relay, a line name=postgres://... each (# comments); re-read on SIGHUP"),
		cli.Opt("max-conns-total", "RELAY_MAX_CONNS_TOTAL", "", &s.maxConnsTotal, 400, "most database connections of all the databases' pools together (each at least "+strconv.Itoa(relay.PoolConns(defaultPartitions))+", plus 2 beside it); more is refused at start and at reload"),
		cli.Opt("in-flight-events", "RELAY_IN_FLIGHT_EVENTS", "InFlightEvents", &c.InFlightEvents, relay.DefaultInFlightEvents, "with several databases: events the relay fleet hands to the broker and has not seen acknowledged; each relay takes 1/N (N relays alive), and while k of its databases publish each may have 1/k of that, so another database's events queue behind at most this many"),
		cli.Opt("node-id", "RELAY_NODE_ID", "NodeID", &c.NodeID, "", "unique name of this relay in the lease table; default <hostname>-<pid>-<random>"),
		cli.Opt("batch-size", "RELAY_BATCH_SIZE", "BatchSize", &c.BatchSize, relay.DefaultBatchSize, "rows published and marked at once per partition, 1-10000"),
		cli.Opt("lease", "RELAY_LEASE", "Lease", &c.Lease, relay.DefaultLease, "partition lease duration: a crashed relay's partitions move after it, or about a second after its lock session ends (docs/relay.md)"),
		cli.Opt("heartbeat", "RELAY_HEARTBEAT", "HeartbeatInterval", &c.HeartbeatInterval, time.Duration(0), "lease renewal and rebalancing interval, at most lease/2; default lease/3"),
		cli.Opt("poll-interval", "RELAY_POLL_INTERVAL", "PollInterval", &c.PollInterval, relay.DefaultPollInterval, "fallback poll of idle partitions; LISTEN/NOTIFY wakes them sooner"),
		cli.Opt("publish-timeout", "RELAY_PUBLISH_TIMEOUT", "PublishTimeout", &c.PublishTimeout, relay.DefaultPublishTimeout, "longest time to publish one batch and collect its acknowledgements"),
		cli.Opt("retention", "RELAY_RETENTION", "Retention", &c.Retention, relay.DefaultRetention, "how long published rows are kept; negative keeps them forever; dead rows are always kept"),
		cli.Opt("retention-interval", "RELAY_RETENTION_INTERVAL", "RetentionInterval", &c.RetentionInterval, relay.DefaultRetentionInterval, "how often expired published rows are deleted"),
		cli.Opt("retention-batch", "RELAY_RETENTION_BATCH", "RetentionBatchSize", &c.RetentionBatchSize, relay.DefaultRetentionBatchSize, "rows deleted per retention statement"),
		cli.Opt("capture", "RELAY_CAPTURE", "Capture", &c.Capture, relay.CaptureTable, "where events are read from: table (the outbox table) or wal (events written with pgrelay.Emit, read from a logical replication slot; docs/wal.md)"),
		cli.Opt("wal-slot", "RELAY_WAL_SLOT", "WALSlot", &c.WALSlot, relay.DefaultWALSlot, "replication slot of --capture wal; one relay streams it, the others wait as standbys"),
		cli.Opt("wal-allow-unbounded-slot", "RELAY_WAL_ALLOW_UNBOUNDED_SLOT", "WALAllowUnboundedSlot", &c.WALAllowUnboundedSlot, false, "create the slot even while max_slot_wal_keep_size is -1 (unlimited)"),
		cli.Opt("wal-truncate-interval", "RELAY_WAL_TRUNCATE_INTERVAL", "WALTruncateInterval", &c.WALTruncateInterval, time.Duration(0), "how often the streaming relay of --capture wal empties pgrelay.outbox_wal with TRUNCATE; negative: never; default 1m"),
		cli.Opt("async-marks", "RELAY_ASYNC_MARKS", "AsyncMarks", &c.AsyncMarks, false, "let each batch's published mark commit without waiting for its WAL flush; a mark a server crash loses only republishes its rows, deduplicated"),
		cli.Opt("standby-names", "RELAY_STANDBY_NAMES", "StandbyNames", &s.standbyNames, "", "publish a row only once every standby named (application_name, comma-separated) has flushed its commit: no event from a commit a failover loses; none connected, nothing is published (docs/operations.md, Failover)"),
		cli.Opt("migrate", "RELAY_MIGRATE", "", &s.migrate, false, "apply pending database migrations before relaying"),
		cli.Opt("log-level", "LOG_LEVEL", "", &s.logLevel, "info", "debug, info, warn or error"),
		cli.Opt("log-format", "LOG_FORMAT", "", &s.logFormat, "json", "json or console"),
	}, cli.EndpointOptions(&s.ops, defaultMetricsAddr, defaultAdminAddr, false)...)
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
	s.urls = newURLList(&s.databaseURL, &s.databaseURLs)
	opts := options(&s)
	s.names = namesOf(opts, &s)
	cli.Bind(root.PersistentFlags(), opts[:2]) // --database-url, --databases-file: every command's databases
	var envKinds map[string]string

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
			if err := cli.ValidateEnv(envKinds); err != nil {
				return err
			}
			return runRelay(cmd.Context(), s, opts, opts.Given(cmd.Flags(), "PollInterval"))
		},
	}
	f := run.Flags()
	brokers := cli.Brokers()
	cli.BindBrokerFlag(f, &s.broker, brokers)
	s.brokers = cli.BindRelaySides(f, brokers)
	cli.BindWireFlags(f, &s.wire)
	envKinds = cli.Bind(f, opts[2:])
	cli.BindDBFlags(f, &s.db, opts.Name("Lease"))

	dbs := func() ([]pgurl.Named, error) { return s.databases() }
	root.AddCommand(run, cli.MigrateCommand(dbs), cli.HealthCommand("relay", defaultMetricsAddr))
	root.AddCommand(admincli.Commands(dbs)...)
	root.AddCommand(tui.Command("relay", dbs))
	return root
}

// databases are the databases relay run would serve, for the operator
// commands: they act on one (--database), the console shows each.
func (s *settings) databases() ([]pgurl.Named, error) {
	list, err := databaseList(s.names, s.databaseURLs, s.databasesFile)
	if err != nil {
		return nil, err
	}
	out := make([]pgurl.Named, len(list))
	for i, e := range list {
		out[i] = pgurl.Named{Name: e.name, URL: e.url, From: e.from}
	}
	return out, nil
}

// runRelay validates the settings, connects, and relays until ctx or a
// signal ends it.
// defaultPartitions is the outbox's partition count in a default install
// (pgrelay.outbox_partition_count()).
const defaultPartitions = 16

func runRelay(parent context.Context, s settings, opts cli.Options, pollIntervalSet bool) error {
	if err := cli.ValidateEnv(cli.DBEnvKinds); err != nil {
		return err
	}
	list, err := databaseList(s.names, s.databaseURLs, s.databasesFile)
	if err != nil {
		return err
	}
	side, err := cli.SelectBroker(s.broker, s.brokers)
	if err != nil {
		return err
	}
	if err := cli.ApplyWire(side, s.broker, s.wire); err != nil {
		return err
	}
	if d, ok := side.(cli.DatabaseDefault); ok {
		d.DefaultDatabase(list[0].url)
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
	rcfg := s.cfg
	rcfg.Logger, rcfg.StandbyNames = log, splitNames(s.standbyNames)
	rcfg.MetricsAddr, rcfg.AdminAddr, rcfg.AdminToken = s.ops.MetricsAddr, s.ops.AdminAddr, s.ops.AdminToken
	if err := rcfg.Validate(); err != nil {
		return opts.NameErrors(err, "relay.Config")
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
	if rcfg.NoListen && !pollIntervalSet {
		rcfg.PollInterval = cli.PoolerPollInterval
	}

	ctx, stop := cli.SignalContext(parent)
	defer stop()

	startCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if rcfg.ListenConnConfig != nil && len(list) > 1 {
		return errListenOne()
	}
	open, _, err := openDatabases(startCtx, s.names, list, nil, dbs, s.maxConnsTotal)
	if err != nil {
		return err
	}
	defer func() {
		for _, o := range open {
			o.pool.Close()
		}
	}()
	if s.migrate {
		for _, e := range list {
			if err := cli.MigrateUp(startCtx, e.url); err != nil {
				return fmt.Errorf("database %s: %w", e.name, err)
			}
		}
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

	listen := rcfg.ListenConnConfig
	if len(list) == 1 && list[0].from == s.names.url {
		rcfg.Pool = open[list[0].name].pool // errors name --database-url
	} else {
		rcfg.Databases, rcfg.ListenConnConfig = relayDatabases(list, open, listen), nil
	}
	rcfg.Publisher, rcfg.BrokerCheck = pub, bc.Healthy
	r, err := relay.New(rcfg)
	if err != nil {
		return opts.NameErrors(err, "relay.Config")
	}
	cancel()
	// SIGHUP re-reads the databases: added ones start, removed ones are
	// released.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	s.db = dbs // resolved
	reloaded := make(chan struct{})
	go func() {
		defer close(reloaded)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				open = reload(ctx, r, s, open, listen, log)
			}
		}
	}()
	// Run checks each database (reachable, migrated) once, then relays.
	err = r.Run(ctx)
	stop()
	<-reloaded
	return cli.SchemaAdvice(opts.NameErrors(err, "relay.Config"), "relay migrate up (or relay run --migrate)")
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
