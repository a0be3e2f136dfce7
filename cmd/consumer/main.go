// Command consumer receives events from a message broker (--broker: NATS
// JetStream by default) into the pgrelay inbox and applies each exactly once
// with the handler --handler selects: the example ledger, the user's SQL
// function or the user's webhook.
//
//	consumer run             consume until SIGTERM
//	consumer migrate up      apply the database migrations (--example-schema: and the ledger's tables)
//	consumer healthcheck     probe a running consumer's /readyz
//	consumer stats | dead | outbox | audit   operate on the database
//
// Every flag can also be set through the environment variable named in its
// help text.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/consumer"
	"github.com/pgrelay/pgrelay/internal/admin/admincli"
	"github.com/pgrelay/pgrelay/internal/cli"
	"github.com/pgrelay/pgrelay/internal/endpoints"
	"github.com/pgrelay/pgrelay/internal/handlers"
	"github.com/pgrelay/pgrelay/internal/ledger"
	"github.com/pgrelay/pgrelay/internal/metrics"
	"github.com/pgrelay/pgrelay/internal/otelenv"
	"github.com/pgrelay/pgrelay/internal/pooler"
	"github.com/pgrelay/pgrelay/internal/setting"
	"github.com/pgrelay/pgrelay/internal/tui"
	"github.com/pgrelay/pgrelay/otelpgrelay"
)

func main() {
	if err := newRootCommand().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", strings.TrimPrefix(err.Error(), "consumer: "))
		os.Exit(1)
	}
}

// settings are the command line, each defaulted from its environment variable.
type settings struct {
	databaseURL     string
	broker          string
	brokers         map[string]cli.ConsumerSide
	batchSize       int
	maxWait         time.Duration
	ingestLoops     int
	maxPayloadBytes int
	workers         int
	workerBatchSize int
	maxAttempts     int
	lease           time.Duration
	handlerTimeout  time.Duration
	statsInterval   time.Duration
	dupRateWarn     float64
	applyOnReceive  bool
	asyncCommit     bool
	asyncFlushAfter time.Duration
	handler         string
	handlerName     string
	dedupKey        string
	dedupKeyTopics  []string
	sqlFunction     string
	httpURL         string
	httpTimeout     time.Duration
	ops             endpoints.Flags
	logLevel        string
	logFormat       string
	db              cli.DBSettings
	ordered         bool
	gapTimeout      time.Duration
}

// The command's own defaults: the operator endpoints' addresses (the relay's
// are one below), and the duplicate rate worth a warning (ConsumerConfig
// leaves the warning off).
const (
	defaultMetricsAddr = ":9091"
	defaultAdminAddr   = "127.0.0.1:9191"
	defaultDupRateWarn = 0.5
)

// envKinds lists the typed environment variables, checked at start-up.
var envKinds = map[string]string{
	"CONSUMER_BATCH_SIZE":        "int",
	"CONSUMER_MAX_WAIT":          "duration",
	"CONSUMER_INGEST_LOOPS":      "int",
	"CONSUMER_MAX_PAYLOAD_BYTES": "int",
	"CONSUMER_WORKERS":           "int",
	"CONSUMER_ORDERED":           "bool",
	"CONSUMER_GAP_TIMEOUT":       "duration",
	"CONSUMER_WORKER_BATCH_SIZE": "int",
	"CONSUMER_MAX_ATTEMPTS":      "int",
	"CONSUMER_LEASE":             "duration",
	"CONSUMER_HANDLER_TIMEOUT":   "duration",
	"CONSUMER_STATS_INTERVAL":    "duration",
	"CONSUMER_HTTP_TIMEOUT":      "duration",
}

// flagOf names the flag and environment variable that set each consumer.Config
// field, so that validation errors name what the user sets.
var flagOf = map[string]string{
	"Inbox.BatchSize":               "--worker-batch-size (CONSUMER_WORKER_BATCH_SIZE)",
	"Inbox.Workers":                 "--workers (CONSUMER_WORKERS)",
	"Inbox.MaxAttempts":             "--max-attempts (CONSUMER_MAX_ATTEMPTS)",
	"Inbox.HandlerTimeout":          "--handler-timeout (CONSUMER_HANDLER_TIMEOUT)",
	"Inbox.Lease":                   "--lease (CONSUMER_LEASE)",
	"Inbox.GapTimeout":              "--gap-timeout (CONSUMER_GAP_TIMEOUT)",
	"Inbox.Retention.DuplicatesMax": "--dedup-record-max (DEDUP_RECORD_MAX)",
	"Inbox.Retention.Window":        "--dedup-window (DEDUP_WINDOW)",
	"Inbox.HandlerName":             "--handler-name (CONSUMER_HANDLER_NAME)",
	"Inbox.Handler":                 "the handler",
	"DedupKeyByTopic":               "--dedup-key-topic (CONSUMER_DEDUP_KEY_TOPICS)",
	"DedupKey":                      "--dedup-key (CONSUMER_DEDUP_KEY)",
	"FetchBatchSize":                "--batch-size (CONSUMER_BATCH_SIZE)",
	"MaxWait":                       "--max-wait (CONSUMER_MAX_WAIT)",
	"IngestLoops":                   "--ingest-loops (CONSUMER_INGEST_LOOPS)",
	"AsyncCommit":                   "--async-commit (CONSUMER_ASYNC_COMMIT)",
	"AsyncFlushAfter":               "--async-flush-after (CONSUMER_ASYNC_FLUSH_AFTER)",
	"DupRateWarn":                   "--dup-rate-warn (CONSUMER_DUP_RATE_WARN)",
	"MetricsAddr":                   "--metrics-addr (METRICS_ADDR)",
	"AdminAddr":                     "--admin-addr (ADMIN_ADDR)",
	"AdminToken":                    "--admin-token (ADMIN_TOKEN)",
	"Pool":                          "--database-url (DATABASE_URL)",
}

// nameSettings spells the ConsumerConfig fields of err's
// *setting.FieldErrors as the settings the user sets.
func nameSettings(err error) error {
	return setting.Map(err, func(fe *setting.FieldError) error {
		if fe.Struct != "consumer.Config" {
			return fe // a broker adapter's, named by its side already
		}
		return setting.Name(fe, func(field string) string { return flagOf[field] })
	})
}

func newRootCommand() *cobra.Command {
	var s settings
	root := &cobra.Command{
		Use:   "consumer",
		Short: "Receive events from a message broker into the inbox and apply them exactly once",
		Long: `consumer fetches events from a message broker (--broker; with nats, a
JetStream durable pull consumer), stores each fetched batch in the PostgreSQL
inbox in one transaction (deduplicated by event id), commits, then
acknowledges the batch. Inbox workers in the same process apply
each event exactly once with --handler: ledger (the worked example), sql (your
function, in the inbox transaction) or http (your webhook). Malformed messages are stored dead with
the reason and acknowledged, never dropped.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	pf := root.PersistentFlags()
	pf.StringVar(&s.databaseURL, "database-url", cli.EnvString("DATABASE_URL", ""), "PostgreSQL URL (DATABASE_URL)")
	pf.StringVar(&s.logLevel, "log-level", cli.EnvString("LOG_LEVEL", "info"), "log level: debug, info, warn, error (LOG_LEVEL)")
	pf.StringVar(&s.logFormat, "log-format", cli.EnvString("LOG_FORMAT", "json"), "log format: json or console (LOG_FORMAT)")

	run := &cobra.Command{
		Use:   "run",
		Short: "Consume until SIGTERM or SIGINT",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return runConsumer(cmd.Context(), s) },
	}
	f := run.Flags()
	brokers := cli.Brokers()
	cli.BindBrokerFlag(f, &s.broker, brokers)
	s.brokers = cli.BindConsumerSides(f, brokers)
	f.IntVar(&s.batchSize, "batch-size", cli.EnvInt("CONSUMER_BATCH_SIZE", consumer.DefaultFetchBatchSize), "messages per fetch, stored in one transaction (CONSUMER_BATCH_SIZE)")
	f.IntVar(&s.ingestLoops, "ingest-loops", cli.EnvInt("CONSUMER_INGEST_LOOPS", consumer.DefaultIngestLoops), "fetched batches stored at once, each in its own transaction and acknowledged after its own commit, while the next is fetched; 1 fetches, stores, commits and acknowledges one at a time (CONSUMER_INGEST_LOOPS)")
	f.DurationVar(&s.maxWait, "max-wait", cli.EnvDuration("CONSUMER_MAX_WAIT", consumer.DefaultMaxWait), "longest wait of an idle fetch for a first message; also bounds shutdown (CONSUMER_MAX_WAIT)")
	f.IntVar(&s.maxPayloadBytes, "max-payload-bytes", cli.EnvInt("CONSUMER_MAX_PAYLOAD_BYTES", consumer.DefaultMaxPayloadBytes), "larger payloads are stored dead (CONSUMER_MAX_PAYLOAD_BYTES)")
	f.IntVar(&s.workers, "workers", cli.EnvInt("CONSUMER_WORKERS", pgrelay.DefaultWorkers), "concurrent inbox worker batches (CONSUMER_WORKERS)")
	f.IntVar(&s.workerBatchSize, "worker-batch-size", cli.EnvInt("CONSUMER_WORKER_BATCH_SIZE", pgrelay.DefaultBatchSize), "events per inbox worker transaction (CONSUMER_WORKER_BATCH_SIZE)")
	f.IntVar(&s.maxAttempts, "max-attempts", cli.EnvInt("CONSUMER_MAX_ATTEMPTS", pgrelay.DefaultMaxAttempts), "handler attempts before an event goes dead (CONSUMER_MAX_ATTEMPTS)")
	f.DurationVar(&s.lease, "lease", cli.EnvDuration("CONSUMER_LEASE", pgrelay.DefaultLease), "inbox claim lease: events of a crashed worker are taken over after it (CONSUMER_LEASE)")
	f.DurationVar(&s.handlerTimeout, "handler-timeout", cli.EnvDuration("CONSUMER_HANDLER_TIMEOUT", pgrelay.DefaultHandlerTimeout), "bound on one handler call; must be shorter than --lease (CONSUMER_HANDLER_TIMEOUT)")
	f.DurationVar(&s.statsInterval, "stats-interval", cli.EnvDuration("CONSUMER_STATS_INTERVAL", consumer.DefaultStatsInterval), "how often the ingest counters are logged; negative disables (CONSUMER_STATS_INTERVAL)")
	f.BoolVar(&s.applyOnReceive, "apply-on-receive", cli.EnvBool("CONSUMER_APPLY_ON_RECEIVE", true), "while the workers are idle and the consumer keeps up, run the handler in the transaction that stores a fetched batch; what fails there is left to the workers (CONSUMER_APPLY_ON_RECEIVE)")
	f.BoolVar(&s.asyncCommit, "async-commit", cli.EnvBool("CONSUMER_ASYNC_COMMIT", false), "commit each fetched batch without waiting for the WAL flush (synchronous_commit off for that transaction) and acknowledge it once the server has flushed past the commit, so the next fetch does not wait; needs PostgreSQL itself, not --pooler (CONSUMER_ASYNC_COMMIT)")
	f.DurationVar(&s.asyncFlushAfter, "async-flush-after", cli.EnvDuration("CONSUMER_ASYNC_FLUSH_AFTER", consumer.DefaultAsyncFlushAfter), "with --async-commit: how long an acknowledgement waits for the server to flush the commit before the consumer forces the flush with a tiny synchronous transaction (CONSUMER_ASYNC_FLUSH_AFTER)")
	f.Float64Var(&s.dupRateWarn, "dup-rate-warn", envFloat("CONSUMER_DUP_RATE_WARN", defaultDupRateWarn), "log \"high duplicate rate\" at warn when more than this share (0..1) of one --stats-interval's deliveries were duplicates; 0 disables (CONSUMER_DUP_RATE_WARN)")
	f.StringVar(&s.handler, "handler", cli.EnvString("CONSUMER_HANDLER", "ledger"), "what applies each event: ledger (the worked example), sql (--sql-function) or http (--url) (CONSUMER_HANDLER)")
	f.StringVar(&s.handlerName, "handler-name", cli.EnvString("CONSUMER_HANDLER_NAME", pgrelay.DefaultHandlerName), "the handler's name: its inbox rows, attempts and dead letters are its own, so several handlers each process an event once; a-z, 0-9, '_', '.', '-' (CONSUMER_HANDLER_NAME)")
	f.StringVar(&s.dedupKey, "dedup-key", cli.EnvString("CONSUMER_DEDUP_KEY", "message-id"), "how the handler's dedup key is built: message-id, 'business:payment:{order_id}', content-hash[:field,...], 'hybrid:content-hash[:fields]@1h' or @header:<name> (CONSUMER_DEDUP_KEY)")
	f.StringArrayVar(&s.dedupKeyTopics, "dedup-key-topic", envList("CONSUMER_DEDUP_KEY_TOPICS"), "TOPIC=SPEC: another --dedup-key for the messages of one topic; repeatable (CONSUMER_DEDUP_KEY_TOPICS, ';'-separated)")
	f.StringVar(&s.sqlFunction, "sql-function", cli.EnvString("CONSUMER_SQL_FUNCTION", ""), "with --handler sql: the function called with each event in the inbox transaction, name or schema.name, taking "+handlers.SQLSignature+" (CONSUMER_SQL_FUNCTION)")
	f.StringVar(&s.httpURL, "url", cli.EnvString("CONSUMER_HTTP_URL", ""), "with --handler http: the webhook each event is POSTed to (CONSUMER_HTTP_URL)")
	f.DurationVar(&s.httpTimeout, "http-timeout", cli.EnvDuration("CONSUMER_HTTP_TIMEOUT", handlers.DefaultHTTPTimeout), "with --handler http: bound on one webhook request; must be shorter than --handler-timeout (CONSUMER_HTTP_TIMEOUT)")
	f.BoolVar(&s.ordered, "ordered", cli.EnvBool("CONSUMER_ORDERED", false), "apply each key's events strictly in their per-key sequence (Pgrelay-Key-Seq): later events wait for a missing, retrying or dead earlier one; duplicates are absorbed (CONSUMER_ORDERED)")
	f.DurationVar(&s.gapTimeout, "gap-timeout", cli.EnvDuration("CONSUMER_GAP_TIMEOUT", pgrelay.DefaultGapTimeout), "with --ordered: how long a key waits for a missing sequence before the gap is reported (consumer gaps list/skip) (CONSUMER_GAP_TIMEOUT)")
	cli.BindEndpointFlags(f, &s.ops, defaultMetricsAddr, defaultAdminAddr, true)
	cli.BindDBFlags(f, &s.db, "--lease")

	var probeAddr string
	health := &cobra.Command{
		Use:   "healthcheck",
		Short: "Exit 0 when the consumer serving --metrics-addr is ready (for container health checks)",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return metrics.ProbeReady(cmd.Context(), probeAddr) },
	}
	health.Flags().StringVar(&probeAddr, "metrics-addr", cli.EnvString("METRICS_ADDR", defaultMetricsAddr), "the consumer's --metrics-addr (METRICS_ADDR)")

	migrate := cli.MigrateCommand(&s.databaseURL)
	addExampleSchemaFlag(migrate, &s.databaseURL)
	root.AddCommand(run, migrate, health)
	root.AddCommand(admincli.Commands(&s.databaseURL)...)
	root.AddCommand(tui.Command("consumer", &s.databaseURL))
	return root
}

func runConsumer(parent context.Context, s settings) error {
	if err := cli.ValidateEnv(envKinds); err != nil {
		return err
	}
	if v, ok := os.LookupEnv("CONSUMER_DUP_RATE_WARN"); ok {
		if _, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err != nil {
			return fmt.Errorf("CONSUMER_DUP_RATE_WARN %q: want a number between 0 and 1", v)
		}
	}
	if err := cli.ValidateEnv(cli.EndpointEnvKinds); err != nil {
		return err
	}
	if err := cli.ValidateEnv(cli.DBEnvKinds); err != nil {
		return err
	}
	if s.databaseURL == "" {
		return errors.New("--database-url (DATABASE_URL) is required")
	}
	log, err := cli.NewLogger(s.logLevel, s.logFormat)
	if err != nil {
		return err
	}
	// OTEL_* environment variables; none set: no tracing (docs/tracing.md).
	tp, err := otelenv.New(parent, "pgrelay-consumer")
	if err != nil {
		return err
	}
	if tp != nil {
		// Flushed at exit, after the last handler returned.
		defer shutdownTracing(tp, log)
	}

	ctx, stop := cli.SignalContext(parent)
	defer stop()

	// The idle in transaction timeout defaults to the lease: a batch whose
	// process hangs with its transaction open loses its row locks then, so
	// its events can be taken over.
	lease, handlerTimeout := s.lease, s.handlerTimeout
	if lease <= 0 {
		lease = pgrelay.DefaultLease
	}
	if handlerTimeout <= 0 {
		handlerTimeout = pgrelay.DefaultHandlerTimeout
	}
	dbs, err := s.db.Resolve(lease, handlerTimeout)
	if err != nil {
		return err
	}
	if s.asyncCommit && dbs.Pooler != pooler.None {
		// The acker proves a commit flushed by a server connection that
		// was open across it: a pooler's client connection outlives the
		// server's.
		return fmt.Errorf("--async-commit (CONSUMER_ASYNC_COMMIT) needs a direct connection to PostgreSQL, got --pooler (DB_POOLER) %s: "+
			"the acknowledgements wait for the WAL flush read on a server connection that a crash would cut, which a pooler hides; "+
			"leave --async-commit off behind a pooler (docs/consumer.md, \"Asynchronous commit\")", dbs.Pooler)
	}
	// Inbox workers and ingest loops each hold a connection; LISTEN, the metrics
	// collector and retention need a few more. The http handler records a
	// failed attempt's response on a second connection, beside its batch's.
	conns := s.workers + 3 + max(1, s.ingestLoops)
	if s.handler == "http" {
		conns += s.workers
	}
	pool, err := cli.OpenPool(ctx, s.databaseURL, dbs, int32(conns))
	if err != nil {
		return err
	}
	defer pool.Close()

	if err := checkHandlerSettings(s); err != nil {
		return err
	}
	if s.ops.DedupRecordMax < 1 {
		return fmt.Errorf("--dedup-record-max (DEDUP_RECORD_MAX) must be at least 1, got %d", s.ops.DedupRecordMax)
	}
	side, err := cli.SelectBroker(s.broker, s.brokers)
	if err != nil {
		return err
	}
	byTopic, err := parseDedupKeyTopics(s.dedupKeyTopics)
	if err != nil {
		return err
	}
	opts := cli.SubscriberOptions{BatchSize: s.batchSize, DedupWindow: s.ops.DedupWindow,
		MaxPayloadBytes: s.maxPayloadBytes, HandlerName: s.handlerName, Logger: log}
	cfg := consumer.Config{
		Pool:      pool,
		Subscribe: side.Subscribe(opts),
		Inbox: pgrelay.InboxConfig{
			Handler:        ledger.Handler{}, // replaced below once the database is checked
			HandlerName:    s.handlerName,
			Workers:        s.workers,
			BatchSize:      s.workerBatchSize,
			MaxAttempts:    s.maxAttempts,
			Lease:          s.lease,
			HandlerTimeout: s.handlerTimeout,
			Ordered:        s.ordered,
			GapTimeout:     s.gapTimeout,
			Retention: pgrelay.InboxRetentionConfig{
				Window: s.ops.DedupWindow, DuplicatesMax: s.ops.DedupRecordMax,
			},
		},
		DedupKey:         s.dedupKey,
		DedupKeyByTopic:  byTopic,
		FetchBatchSize:   s.batchSize,
		MaxWait:          s.maxWait,
		IngestLoops:      s.ingestLoops,
		StatsInterval:    s.statsInterval,
		DupRateWarn:      s.dupRateWarn,
		NoApplyOnReceive: !s.applyOnReceive,
		AsyncCommit:      s.asyncCommit,
		AsyncFlushAfter:  s.asyncFlushAfter,
		MetricsAddr:      s.ops.MetricsAddr,
		AdminAddr:        s.ops.AdminAddr,
		AdminToken:       s.ops.AdminToken,
		Logger:           log,
	}
	if d, ok := side.(cli.DirectSide); ok {
		// The relay stores into this database's inbox: no subscriber.
		cfg.Subscribe, cfg.Direct, cfg.DirectTopics = nil, true, d.DirectTopics()
	}
	// Settings first (no database needed), so that a bad flag is reported
	// even when the database is down.
	if _, err := consumer.New(cfg); err != nil {
		return nameSettings(err)
	}
	if err := side.Check(opts); err != nil {
		return err
	}
	if cfg.Inbox.ListenConnConfig, cfg.Inbox.NoListen, err = dbs.Listen(); err != nil {
		return err
	}
	if err := checkDatabase(ctx, pool, dbs, s.handler == "ledger"); err != nil {
		return err
	}
	if cfg.Inbox.Handler, err = newHandler(ctx, s, pool, log); err != nil {
		return err
	}
	if tp != nil {
		cfg.Inbox.Handler = otelpgrelay.NewHandler(cfg.Inbox.Handler, otelpgrelay.WithTracerProvider(tp), otelpgrelay.WithSystem(s.broker))
	}
	c, err := consumer.New(cfg)
	if err != nil {
		return nameSettings(err)
	}
	// Run checks the database (reachable, migrated) once, then consumes.
	if err := c.Run(ctx); err != nil {
		return cli.SchemaAdvice(nameSettings(err), "consumer migrate up")
	}
	return nil
}

// envList splits the environment variable name on ';' (empty entries
// dropped).
func envList(name string) []string {
	var out []string
	for _, v := range strings.Split(os.Getenv(name), ";") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}

// parseDedupKeyTopics parses --dedup-key-topic TOPIC=SPEC values; the specs
// themselves are checked with the rest of the settings.
func parseDedupKeyTopics(vals []string) (map[string]string, error) {
	if len(vals) == 0 {
		return nil, nil
	}
	out := make(map[string]string, len(vals))
	for _, v := range vals {
		topic, spec, ok := strings.Cut(v, "=")
		if !ok || strings.TrimSpace(topic) == "" {
			return nil, fmt.Errorf("--dedup-key-topic (CONSUMER_DEDUP_KEY_TOPICS) %q: want TOPIC=SPEC, for example 'payments=business:payment:{order_id}'", v)
		}
		topic = strings.TrimSpace(topic)
		if _, dup := out[topic]; dup {
			return nil, fmt.Errorf("--dedup-key-topic (CONSUMER_DEDUP_KEY_TOPICS): topic %q is given twice", topic)
		}
		out[topic] = spec
	}
	return out, nil
}

// envFloat returns the environment variable name as a number, or def when it
// is unset or not a number (runConsumer reports the latter).
func envFloat(name string, def float64) float64 {
	if v, ok := os.LookupEnv(name); ok {
		if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
			return f
		}
	}
	return def
}

// checkHandlerSettings checks the handler flags that need no database.
func checkHandlerSettings(s settings) error {
	if s.sqlFunction != "" && s.handler != "sql" {
		return fmt.Errorf("--sql-function (CONSUMER_SQL_FUNCTION) is set but --handler (CONSUMER_HANDLER) is %s: add --handler sql", s.handler)
	}
	if s.httpURL != "" && s.handler != "http" {
		return fmt.Errorf("--url (CONSUMER_HTTP_URL) is set but --handler (CONSUMER_HANDLER) is %s: add --handler http", s.handler)
	}
	switch s.handler {
	case "ledger":
	case "sql":
		if s.sqlFunction == "" {
			return errors.New("--sql-function (CONSUMER_SQL_FUNCTION) is required with --handler sql")
		}
	case "http":
		if s.httpURL == "" {
			return errors.New("--url (CONSUMER_HTTP_URL) is required with --handler http")
		}
		handlerTimeout := s.handlerTimeout
		if handlerTimeout <= 0 {
			handlerTimeout = pgrelay.DefaultHandlerTimeout
		}
		if s.httpTimeout <= 0 || s.httpTimeout >= handlerTimeout {
			return fmt.Errorf("--http-timeout (CONSUMER_HTTP_TIMEOUT) %s must be positive and shorter than --handler-timeout (CONSUMER_HANDLER_TIMEOUT) %s",
				s.httpTimeout, handlerTimeout)
		}
		if _, err := handlers.NewHTTP(handlers.HTTPConfig{URL: s.httpURL, Timeout: s.httpTimeout}); err != nil {
			return errors.New(strings.Replace(err.Error(), "HTTPConfig.URL", "--url (CONSUMER_HTTP_URL)", 1))
		}
	default:
		return fmt.Errorf("--handler (CONSUMER_HANDLER) %q: want ledger, sql or http", s.handler)
	}
	return nil
}

// newHandler builds the handler --handler selects; the sql handler's function
// must exist in the database.
func newHandler(ctx context.Context, s settings, pool *pgxpool.Pool, log *slog.Logger) (pgrelay.InboxHandler, error) {
	switch s.handler {
	case "sql":
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		h, err := handlers.NewSQL(ctx, pool, s.sqlFunction)
		if err != nil {
			return nil, fmt.Errorf("--sql-function (CONSUMER_SQL_FUNCTION): %w", err)
		}
		return h, nil
	case "http":
		h, err := handlers.NewHTTP(handlers.HTTPConfig{URL: s.httpURL, Timeout: s.httpTimeout, Recorder: pool, Logger: log})
		if err != nil {
			return nil, errors.New(strings.Replace(err.Error(), "HTTPConfig.URL", "--url (CONSUMER_HTTP_URL)", 1))
		}
		return h, nil
	default:
		return ledger.Handler{}, nil
	}
}

// checkDatabase fails start-up when the database cannot be reached (the
// consumer's Run checks the migrations). The ledger handler also needs the
// example schema.
func checkDatabase(ctx context.Context, pool *pgxpool.Pool, dbs cli.DBSettings, ledgerHandler bool) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := dbs.Reach(ctx, pool); err != nil {
		return err
	}
	if !ledgerHandler {
		return nil
	}
	return checkExampleSchema(ctx, pool)
}

// shutdownTracing flushes the spans still buffered, waiting 5s at most.
func shutdownTracing(tp *otelenv.Provider, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := tp.Shutdown(ctx); err != nil {
		log.Warn("flush traces", slog.Any("error", err))
	}
}
