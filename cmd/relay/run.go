package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/pgrelay/pgrelay/internal/admin"
	"github.com/pgrelay/pgrelay/internal/broker"
	"github.com/pgrelay/pgrelay/internal/cli"
	"github.com/pgrelay/pgrelay/internal/metrics"
	"github.com/pgrelay/pgrelay/internal/relay"
	"github.com/pgrelay/pgrelay/internal/tui"
	"github.com/pgrelay/pgrelay/migrations"
)

// settings are the command line, each defaulted from its environment variable.
type settings struct {
	databaseURL        string
	natsURL            string
	embeddedDir        string
	embeddedListen     string
	stream             string
	subjectPrefix      string
	createStream       bool
	streamMaxAge       time.Duration
	ackTimeout         time.Duration
	nodeID             string
	batchSize          int
	lease              time.Duration
	heartbeat          time.Duration
	pollInterval       time.Duration
	publishTimeout     time.Duration
	retention          time.Duration
	retentionInterval  time.Duration
	retentionBatchSize int
	migrate            bool
	logLevel           string
	logFormat          string
	ops                admin.OpsFlags
	db                 cli.DBSettings
}

// envKinds lists the typed environment variables, checked at start-up.
var envKinds = map[string]string{
	"RELAY_CREATE_STREAM":      "bool",
	"RELAY_STREAM_MAX_AGE":     "duration",
	"RELAY_ACK_TIMEOUT":        "duration",
	"RELAY_BATCH_SIZE":         "int",
	"RELAY_LEASE":              "duration",
	"RELAY_HEARTBEAT":          "duration",
	"RELAY_POLL_INTERVAL":      "duration",
	"RELAY_PUBLISH_TIMEOUT":    "duration",
	"RELAY_RETENTION":          "duration",
	"RELAY_RETENTION_INTERVAL": "duration",
	"RELAY_RETENTION_BATCH":    "int",
	"RELAY_MIGRATE":            "bool",
}

// configFields maps relay.Config and broker.NATSConfig fields onto the
// settings that fill them, so validation errors name what the user sets.
var configFields = []struct{ field, setting string }{
	{"Config.BatchSize", "--batch-size (RELAY_BATCH_SIZE)"},
	{"Config.LeaseDuration", "--lease (RELAY_LEASE)"},
	{"Config.HeartbeatInterval", "--heartbeat (RELAY_HEARTBEAT)"},
	{"Config.PollInterval", "--poll-interval (RELAY_POLL_INTERVAL)"},
	{"Config.PublishTimeout", "--publish-timeout (RELAY_PUBLISH_TIMEOUT)"},
	{"Config.RetentionInterval", "--retention-interval (RELAY_RETENTION_INTERVAL)"},
	{"Config.RetentionBatchSize", "--retention-batch (RELAY_RETENTION_BATCH)"},
	{"NATSConfig.SubjectPrefix", "--subject-prefix (RELAY_SUBJECT_PREFIX)"},
	{"NATSConfig.Stream", "--stream (RELAY_STREAM)"},
	{"NATSConfig.AckTimeout", "--ack-timeout (RELAY_ACK_TIMEOUT)"},
}

// nameSetting rewrites a configuration error of the relay or broker package
// into the settings the user sets. Those packages prefix their errors with
// their name; main prefixes the command's name, so the package prefix is
// dropped here rather than printed twice ("relay: relay: ...").
func nameSetting(err error) error {
	lines := strings.Split(err.Error(), "\n")
	for i, msg := range lines {
		msg = strings.TrimPrefix(strings.TrimPrefix(msg, "relay: "), "broker: ")
		for _, f := range configFields {
			msg = strings.ReplaceAll(msg, f.field, f.setting)
		}
		lines[i] = msg
	}
	return errors.New(strings.Join(lines, "\n"))
}

func newRootCommand() *cobra.Command {
	var s settings
	root := &cobra.Command{
		Use:   "relay",
		Short: "Publish committed outbox rows to NATS JetStream",
		Long: `relay publishes the rows applications commit into the pgrelay outbox table to
NATS JetStream, in commit order per key, then marks them published.

Several relays can run against one database: they share the outbox partitions
through leases, and a relay that crashes has its partitions taken over when its
leases expire. A relay that lost a partition cannot mark its rows (fencing).

Every event is published to <subject-prefix>.<topic> with the event id as
JetStream's dedup id (Nats-Msg-Id) and its metadata in Pgrelay-* headers.`,
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

Without --nats-url an embedded NATS server with JetStream is started in this
process (data in --embedded-nats-dir, listening on --embedded-nats-listen) and
the stream is created, so a first run needs only PostgreSQL.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runRelay(cmd.Context(), s) },
	}
	f := run.Flags()
	f.StringVar(&s.natsURL, "nats-url", cli.EnvString("NATS_URL", ""), "NATS server URL (env NATS_URL); empty starts an embedded NATS server")
	f.StringVar(&s.embeddedDir, "embedded-nats-dir", cli.EnvString("RELAY_EMBEDDED_NATS_DIR", "./.pgrelay/nats"), "JetStream data directory of the embedded NATS server (env RELAY_EMBEDDED_NATS_DIR)")
	f.StringVar(&s.embeddedListen, "embedded-nats-listen", cli.EnvString("RELAY_EMBEDDED_NATS_LISTEN", "127.0.0.1:4222"), "host:port the embedded NATS server listens on (env RELAY_EMBEDDED_NATS_LISTEN)")
	f.StringVar(&s.stream, "stream", cli.EnvString("RELAY_STREAM", "PGRELAY"), "JetStream stream storing the subjects (env RELAY_STREAM)")
	f.StringVar(&s.subjectPrefix, "subject-prefix", cli.EnvString("RELAY_SUBJECT_PREFIX", "pgrelay"), "subject prefix: topic orders goes to <prefix>.orders (env RELAY_SUBJECT_PREFIX)")
	f.BoolVar(&s.createStream, "create-stream", cli.EnvBool("RELAY_CREATE_STREAM", false), "create the stream (subjects <prefix>.>) if missing, never changing an existing one; always on with the embedded server (env RELAY_CREATE_STREAM)")
	f.DurationVar(&s.streamMaxAge, "stream-max-age", cli.EnvDuration("RELAY_STREAM_MAX_AGE", broker.DefaultStreamMaxAge), "MaxAge of a stream the relay creates; keep it within the consumer's --dedup-window; negative: no limit (env RELAY_STREAM_MAX_AGE)")
	f.DurationVar(&s.ackTimeout, "ack-timeout", cli.EnvDuration("RELAY_ACK_TIMEOUT", 5*time.Second), "longest wait for one JetStream acknowledgement (env RELAY_ACK_TIMEOUT)")
	f.StringVar(&s.nodeID, "node-id", cli.EnvString("RELAY_NODE_ID", ""), "unique name of this relay in the lease table (env RELAY_NODE_ID); default <hostname>-<pid>-<random>")
	f.IntVar(&s.batchSize, "batch-size", cli.EnvInt("RELAY_BATCH_SIZE", 500), "rows published and marked at once per partition, 1-10000 (env RELAY_BATCH_SIZE)")
	f.DurationVar(&s.lease, "lease", cli.EnvDuration("RELAY_LEASE", 15*time.Second), "partition lease duration: a crashed relay's partitions move after it (env RELAY_LEASE)")
	f.DurationVar(&s.heartbeat, "heartbeat", cli.EnvDuration("RELAY_HEARTBEAT", 0), "lease renewal and rebalancing interval, at most lease/2 (env RELAY_HEARTBEAT); default lease/3")
	f.DurationVar(&s.pollInterval, "poll-interval", cli.EnvDuration("RELAY_POLL_INTERVAL", time.Second), "fallback poll of idle partitions; LISTEN/NOTIFY wakes them sooner (env RELAY_POLL_INTERVAL)")
	f.DurationVar(&s.publishTimeout, "publish-timeout", cli.EnvDuration("RELAY_PUBLISH_TIMEOUT", 30*time.Second), "longest time to publish one batch and collect its acknowledgements (env RELAY_PUBLISH_TIMEOUT)")
	f.DurationVar(&s.retention, "retention", cli.EnvDuration("RELAY_RETENTION", 24*time.Hour), "how long published rows are kept; negative keeps them forever; dead rows are always kept (env RELAY_RETENTION)")
	f.DurationVar(&s.retentionInterval, "retention-interval", cli.EnvDuration("RELAY_RETENTION_INTERVAL", time.Minute), "how often expired published rows are deleted (env RELAY_RETENTION_INTERVAL)")
	f.IntVar(&s.retentionBatchSize, "retention-batch", cli.EnvInt("RELAY_RETENTION_BATCH", 1000), "rows deleted per retention statement (env RELAY_RETENTION_BATCH)")
	f.BoolVar(&s.migrate, "migrate", cli.EnvBool("RELAY_MIGRATE", false), "apply pending database migrations before relaying (env RELAY_MIGRATE)")
	f.StringVar(&s.logLevel, "log-level", cli.EnvString("LOG_LEVEL", "info"), "debug, info, warn or error (env LOG_LEVEL)")
	f.StringVar(&s.logFormat, "log-format", cli.EnvString("LOG_FORMAT", "json"), "json or console (env LOG_FORMAT)")

	admin.BindOpsFlags(f, &s.ops, ":9090", "127.0.0.1:9190", false)
	cli.BindDBFlags(f, &s.db, "--lease")

	root.AddCommand(run, cli.MigrateCommand(&s.databaseURL), healthCommand())
	root.AddCommand(admin.Commands(&s.databaseURL)...)
	root.AddCommand(tui.Command("relay", &s.databaseURL))
	return root
}

// runRelay validates the settings, connects, and relays until ctx or a
// signal ends it.
// defaultPartitions is the outbox's partition count in a default install
// (outbox_partition_count()).
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
	if s.ackTimeout <= 0 {
		return fmt.Errorf("--ack-timeout (RELAY_ACK_TIMEOUT) must be positive, got %s", s.ackTimeout)
	}
	log, err := cli.NewLogger(s.logLevel, s.logFormat)
	if err != nil {
		return err
	}
	rcfg := relay.Config{
		Logger: log, NodeID: s.nodeID,
		BatchSize: s.batchSize, LeaseDuration: s.lease, HeartbeatInterval: s.heartbeat,
		PollInterval: s.pollInterval, PublishTimeout: s.publishTimeout,
		Retention: s.retention, RetentionInterval: s.retentionInterval, RetentionBatchSize: s.retentionBatchSize,
	}.WithDefaults()
	if err := rcfg.Validate(); err != nil {
		return nameSetting(err)
	}
	dbs, err := s.db.Resolve(rcfg.LeaseDuration, 0)
	if err != nil {
		return err
	}
	defer log.Sync() //nolint:errcheck

	ctx, stop := cli.SignalContext(parent)
	defer stop()

	startCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// Enough connections for one relay owning every partition of a default
	// install (16): its partition workers read and mark at once, and the
	// LISTEN connection leaves the pool. pgxpool opens them only as needed.
	pool, err := cli.OpenPool(startCtx, s.databaseURL, dbs, int32(relay.PoolConns(defaultPartitions)+1))
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := pool.Ping(startCtx); err != nil {
		return fmt.Errorf("--database-url (DATABASE_URL): cannot reach PostgreSQL: %w", err)
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
		return fmt.Errorf("--database-url (DATABASE_URL): %w; apply the migrations first: relay migrate up (or relay run --migrate)", err)
	}

	natsURL, createStream := s.natsURL, s.createStream
	if natsURL == "" {
		srv, url, err := broker.StartEmbedded(broker.EmbeddedConfig{StoreDir: s.embeddedDir, Listen: s.embeddedListen})
		if err != nil {
			return fmt.Errorf("--embedded-nats-listen/--embedded-nats-dir: %w", err)
		}
		defer func() {
			srv.Shutdown()
			srv.WaitForShutdown()
		}()
		log.Info("embedded NATS JetStream server started", zap.String("url", url), zap.String("store_dir", s.embeddedDir))
		natsURL, createStream = url, true
	}
	pub, err := broker.NewNATS(startCtx, broker.NATSConfig{
		URL: natsURL, SubjectPrefix: s.subjectPrefix, Stream: s.stream, CreateStream: createStream,
		StreamMaxAge: s.streamMaxAge, AckTimeout: s.ackTimeout, Logger: log,
	})
	if err != nil {
		if strings.Contains(err.Error(), "NATSConfig.") {
			return nameSetting(err)
		}
		return fmt.Errorf("--nats-url (NATS_URL): %w", err)
	}
	defer pub.Close()

	reg := metrics.NewRegistry()
	rcfg.Pool, rcfg.Publisher, rcfg.Observer = pool, pub, metrics.NewRelayObserver(reg)
	r, err := relay.New(rcfg)
	if err != nil {
		return nameSetting(err)
	}
	ops, err := admin.StartOps(ctx, admin.OpsConfig{
		Flags: s.ops, Pool: pool, Registry: reg, Outbox: true, Logger: log,
		Checks: map[string]metrics.Check{
			"database": metrics.PingCheck(pool),
			"broker": func(context.Context) error {
				if !pub.Conn().IsConnected() {
					return errors.New("not connected to NATS")
				}
				return nil
			},
		},
	})
	if err != nil {
		return err
	}
	cancel()
	runErr := r.Run(ctx)
	stop() // Run returned on its own: stop the operator endpoints too
	return errors.Join(runErr, ops.Wait())
}
