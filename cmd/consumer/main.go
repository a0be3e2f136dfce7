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
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
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
	"github.com/pgrelay/pgrelay/internal/otelenv"
	"github.com/pgrelay/pgrelay/internal/pgurl"
	"github.com/pgrelay/pgrelay/internal/pooler"
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
	cfg             consumer.Config // the fields the options set
	maxPayloadBytes int
	applyOnReceive  bool
	handler         string
	dedupKeyTopics  []string
	sqlFunction     string
	httpURL         string
	httpTimeout     time.Duration
	ops             endpoints.Flags
	logLevel        string
	logFormat       string
	db              cli.DBSettings
}

// The command's own defaults: the operator endpoints' addresses (the relay's
// are one below), and the duplicate rate worth a warning (consumer.Config
// leaves the warning off).
const (
	defaultMetricsAddr = ":9091"
	defaultAdminAddr   = "127.0.0.1:9191"
	defaultDupRateWarn = 0.5
)

// options lists the settings of consumer run: every flag name and
// environment variable is written here once. The first three are every
// command's.
func options(s *settings) cli.Options {
	c, in := &s.cfg, &s.cfg.Inbox
	return append(cli.Options{
		cli.Opt("database-url", "DATABASE_URL", "Pool", &s.databaseURL, "", "PostgreSQL URL"),
		cli.Opt("log-level", "LOG_LEVEL", "", &s.logLevel, "info", "log level: debug, info, warn, error"),
		cli.Opt("log-format", "LOG_FORMAT", "", &s.logFormat, "json", "log format: json or console"),
		cli.Opt("batch-size", "CONSUMER_BATCH_SIZE", "FetchBatchSize", &c.FetchBatchSize, consumer.DefaultFetchBatchSize, "messages per fetch, stored in one transaction"),
		cli.Opt("ingest-loops", "CONSUMER_INGEST_LOOPS", "IngestLoops", &c.IngestLoops, consumer.DefaultIngestLoops, "fetched batches stored at once, each in its own transaction and acknowledged after its own commit, while the next is fetched; 1 fetches, stores, commits and acknowledges one at a time"),
		cli.Opt("max-wait", "CONSUMER_MAX_WAIT", "MaxWait", &c.MaxWait, consumer.DefaultMaxWait, "longest wait of an idle fetch for a first message; also bounds shutdown"),
		cli.Opt("max-payload-bytes", "CONSUMER_MAX_PAYLOAD_BYTES", "MaxPayloadBytes", &s.maxPayloadBytes, consumer.DefaultMaxPayloadBytes, "larger payloads are stored dead"),
		cli.Opt("workers", "CONSUMER_WORKERS", "Inbox.Workers", &in.Workers, pgrelay.DefaultWorkers, "concurrent inbox worker batches"),
		cli.Opt("worker-batch-size", "CONSUMER_WORKER_BATCH_SIZE", "Inbox.BatchSize", &in.BatchSize, pgrelay.DefaultBatchSize, "events per inbox worker transaction"),
		cli.Opt("max-attempts", "CONSUMER_MAX_ATTEMPTS", "Inbox.MaxAttempts", &in.MaxAttempts, pgrelay.DefaultMaxAttempts, "handler attempts before an event goes dead"),
		cli.Opt("lease", "CONSUMER_LEASE", "Inbox.Lease", &in.Lease, pgrelay.DefaultLease, "inbox claim lease: events of a crashed worker are taken over after it"),
		cli.Opt("handler-timeout", "CONSUMER_HANDLER_TIMEOUT", "Inbox.HandlerTimeout", &in.HandlerTimeout, pgrelay.DefaultHandlerTimeout, "bound on one handler call; must be shorter than --lease"),
		cli.Opt("stats-interval", "CONSUMER_STATS_INTERVAL", "StatsInterval", &c.StatsInterval, consumer.DefaultStatsInterval, "how often the ingest counters are logged; negative disables"),
		cli.Opt("apply-on-receive", "CONSUMER_APPLY_ON_RECEIVE", "NoApplyOnReceive", &s.applyOnReceive, true, "while the workers are idle and the consumer keeps up, run the handler in the transaction that stores a fetched batch; what fails there is left to the workers"),
		cli.Opt("async-commit", "CONSUMER_ASYNC_COMMIT", "AsyncCommit", &c.AsyncCommit, false, "commit each fetched batch without waiting for the WAL flush (synchronous_commit off for that transaction) and acknowledge it once the server has flushed past the commit, so the next fetch does not wait; needs PostgreSQL itself, not --pooler"),
		cli.Opt("async-flush-after", "CONSUMER_ASYNC_FLUSH_AFTER", "AsyncFlushAfter", &c.AsyncFlushAfter, consumer.DefaultAsyncFlushAfter, "with --async-commit: how long an acknowledgement waits for the server to flush the commit before the consumer forces the flush with a tiny synchronous transaction"),
		cli.Opt("dup-rate-warn", "CONSUMER_DUP_RATE_WARN", "DupRateWarn", &c.DupRateWarn, defaultDupRateWarn, "log \"high duplicate rate\" at warn when more than this share (0..1) of one --stats-interval's deliveries were duplicates; 0 disables"),
		cli.Opt("handler", "CONSUMER_HANDLER", "", &s.handler, "ledger", "what applies each event: ledger (the worked example), sql (--sql-function) or http (--url)"),
		cli.Opt("handler-name", "CONSUMER_HANDLER_NAME", "Inbox.HandlerName", &in.HandlerName, pgrelay.DefaultHandlerName, "the handler's name: its inbox rows, attempts and dead letters are its own, so several handlers each process an event once; a-z, 0-9, '_', '.', '-'"),
		cli.Opt("dedup-key", "CONSUMER_DEDUP_KEY", "DedupKey", &c.DedupKey, "message-id", "how the handler's dedup key is built: message-id, 'business:payment:{order_id}', content-hash[:field,...], 'hybrid:content-hash[:fields]@1h' or @header:<name>"),
		cli.Opt("dedup-key-topic", "CONSUMER_DEDUP_KEY_TOPICS", "DedupKeyByTopic", &s.dedupKeyTopics, nil, "TOPIC=SPEC: another --dedup-key for the messages of one topic; repeatable, ';'-separated in the environment"),
		cli.Opt("sql-function", "CONSUMER_SQL_FUNCTION", "", &s.sqlFunction, "", "with --handler sql: the function called with each event in the inbox transaction, name or schema.name, taking "+handlers.SQLSignature),
		cli.Opt("url", "CONSUMER_HTTP_URL", "", &s.httpURL, "", "with --handler http: the webhook each event is POSTed to"),
		cli.Opt("http-timeout", "CONSUMER_HTTP_TIMEOUT", "", &s.httpTimeout, handlers.DefaultHTTPTimeout, "with --handler http: bound on one webhook request; must be shorter than --handler-timeout"),
		cli.Opt("ordered", "CONSUMER_ORDERED", "Inbox.Ordered", &in.Ordered, false, "apply each key's events strictly in their per-key sequence (Pgrelay-Key-Seq): later events wait for a missing, retrying or dead earlier one; duplicates are absorbed"),
		cli.Opt("gap-timeout", "CONSUMER_GAP_TIMEOUT", "Inbox.GapTimeout", &in.GapTimeout, pgrelay.DefaultGapTimeout, "with --ordered: how long a key waits for a missing sequence before the gap is reported (consumer gaps list/skip)"),
	}, cli.EndpointOptions(&s.ops, defaultMetricsAddr, defaultAdminAddr, true)...)
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
	opts := options(&s)
	cli.Bind(root.PersistentFlags(), opts[:3])
	var envKinds map[string]string
	run := &cobra.Command{
		Use:   "run",
		Short: "Consume until SIGTERM or SIGINT",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cli.ValidateEnv(envKinds); err != nil {
				return err
			}
			return runConsumer(cmd.Context(), &s, opts)
		},
	}
	f := run.Flags()
	brokers := cli.Brokers()
	cli.BindBrokerFlag(f, &s.broker, brokers)
	s.brokers = cli.BindConsumerSides(f, brokers)
	envKinds = cli.Bind(f, opts[3:])
	cli.BindDBFlags(f, &s.db, opts.Name("Inbox.Lease"))

	migrate := cli.MigrateCommand(pgurl.One(&s.databaseURL))
	addExampleSchemaFlag(migrate, &s.databaseURL, opts.Name("Pool"))
	root.AddCommand(run, migrate, cli.HealthCommand("consumer", defaultMetricsAddr))
	root.AddCommand(admincli.Commands(pgurl.One(&s.databaseURL))...)
	root.AddCommand(tui.Command("consumer", pgurl.One(&s.databaseURL)))
	return root
}

func runConsumer(parent context.Context, s *settings, opts cli.Options) error {
	if err := cli.ValidateEnv(cli.DBEnvKinds); err != nil {
		return err
	}
	if s.databaseURL == "" {
		return errors.New(opts.Name("Pool") + " is required")
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
	cfg := s.cfg
	lease := cmp.Or(max(cfg.Inbox.Lease, 0), pgrelay.DefaultLease)
	handlerTimeout := cmp.Or(max(cfg.Inbox.HandlerTimeout, 0), pgrelay.DefaultHandlerTimeout)
	dbs, err := s.db.Resolve(lease, handlerTimeout)
	if err != nil {
		return err
	}
	if cfg.AsyncCommit && dbs.Pooler != pooler.None {
		// The acker proves a commit flushed by a server connection that
		// was open across it: a pooler's client connection outlives the
		// server's.
		return fmt.Errorf("%s needs a direct connection to PostgreSQL, got %s %s: "+
			"the acknowledgements wait for the WAL flush read on a server connection that a crash would cut, which a pooler hides; "+
			"leave --async-commit off behind a pooler (docs/consumer.md, \"Asynchronous commit\")", opts.Name("AsyncCommit"), cli.PoolerFlag, dbs.Pooler)
	}
	// Inbox workers and ingest loops each hold a connection; LISTEN, the metrics
	// collector and retention need a few more. The http handler records a
	// failed attempt's response on a second connection, beside its batch's.
	workers := cfg.Inbox.Workers
	conns := workers + 3 + max(1, cfg.IngestLoops)
	if s.handler == "http" {
		conns += workers
	}
	pool, err := cli.OpenPool(ctx, s.databaseURL, dbs, int32(conns))
	if err != nil {
		return err
	}
	defer pool.Close()

	handler, resolve, err := newHandler(s, opts, pool, log)
	if err != nil {
		return err
	}
	if tp != nil {
		handler = otelpgrelay.NewHandler(handler, otelpgrelay.WithTracerProvider(tp), otelpgrelay.WithSystem(s.broker))
	}
	if s.ops.DedupRecordMax < 1 {
		return fmt.Errorf("%s must be at least 1, got %d", opts.Name("Inbox.Retention.DuplicatesMax"), s.ops.DedupRecordMax)
	}
	side, err := cli.SelectBroker(s.broker, s.brokers)
	if err != nil {
		return err
	}
	if cfg.DedupKeyByTopic, err = parseDedupKeyTopics(s.dedupKeyTopics, opts.Name("DedupKeyByTopic")); err != nil {
		return err
	}
	if cfg.Inbox.ListenConnConfig, cfg.Inbox.NoListen, err = dbs.Listen(); err != nil {
		return err
	}
	sopts := cli.SubscriberOptions{BatchSize: cfg.FetchBatchSize, DedupWindow: s.ops.DedupWindow,
		MaxPayloadBytes: s.maxPayloadBytes, HandlerName: cfg.Inbox.HandlerName, Logger: log, Options: opts}
	cfg.Pool, cfg.Subscribe, cfg.Logger, cfg.Inbox.Handler = pool, side.Subscribe(sopts), log, handler
	cfg.Inbox.Retention.Window, cfg.Inbox.Retention.DuplicatesMax = s.ops.DedupWindow, s.ops.DedupRecordMax
	cfg.NoApplyOnReceive = !s.applyOnReceive
	cfg.MetricsAddr, cfg.AdminAddr, cfg.AdminToken = s.ops.MetricsAddr, s.ops.AdminAddr, s.ops.AdminToken
	if d, ok := side.(cli.DirectSide); ok {
		// The relay stores into this database's inbox: no subscriber.
		cfg.Subscribe, cfg.Direct = nil, true
		cfg.Register = d.Register(pool, pgrelay.Target{Handler: cfg.Inbox.HandlerName, DedupKey: cfg.DedupKey, DedupKeyByTopic: cfg.DedupKeyByTopic})
	}
	// Settings first (no database needed), so that a bad flag is reported
	// even when the database is down.
	c, err := consumer.New(cfg)
	if err != nil {
		return opts.NameErrors(err, "consumer.Config")
	}
	if err := side.Check(sopts); err != nil {
		return err
	}
	if err := checkDatabase(ctx, pool, dbs, s.handler == "ledger", opts.Name("Pool")); err != nil {
		return err
	}
	if err := resolve(ctx); err != nil {
		return err
	}
	// Run checks the database (reachable, migrated) once, then consumes.
	if err := c.Run(ctx); err != nil {
		return cli.SchemaAdvice(opts.NameErrors(err, "consumer.Config"), "consumer migrate up")
	}
	return nil
}

// parseDedupKeyTopics parses --dedup-key-topic TOPIC=SPEC values (name
// spells the option); the specs themselves are checked with the rest of the
// settings.
func parseDedupKeyTopics(vals []string, name string) (map[string]string, error) {
	if len(vals) == 0 {
		return nil, nil
	}
	out := make(map[string]string, len(vals))
	for _, v := range vals {
		topic, spec, ok := strings.Cut(v, "=")
		if !ok || strings.TrimSpace(topic) == "" {
			return nil, fmt.Errorf("%s %q: want TOPIC=SPEC, for example 'payments=business:payment:{order_id}'", name, v)
		}
		topic = strings.TrimSpace(topic)
		if _, dup := out[topic]; dup {
			return nil, fmt.Errorf("%s: topic %q is given twice", name, topic)
		}
		out[topic] = spec
	}
	return out, nil
}

// newHandler checks the handler options and builds the handler --handler
// selects. The sql handler's function must exist in the database: resolve
// looks it up once the database is reachable (the settings are checked
// before, the database down or not).
func newHandler(s *settings, opts cli.Options, pool *pgxpool.Pool, log *slog.Logger) (pgrelay.InboxHandler, func(context.Context) error, error) {
	handler, sqlFn, url := opts.Of(&s.handler), opts.Of(&s.sqlFunction), opts.Of(&s.httpURL)
	none := func(context.Context) error { return nil }
	if s.sqlFunction != "" && s.handler != "sql" {
		return nil, nil, fmt.Errorf("%s is set but %s is %s: add --handler sql", sqlFn, handler, s.handler)
	}
	if s.httpURL != "" && s.handler != "http" {
		return nil, nil, fmt.Errorf("%s is set but %s is %s: add --handler http", url, handler, s.handler)
	}
	switch s.handler {
	case "ledger":
		return ledger.Handler{}, none, nil
	case "sql":
		if s.sqlFunction == "" {
			return nil, nil, fmt.Errorf("%s is required with --handler sql", sqlFn)
		}
		h := &sqlHandler{}
		return h, func(ctx context.Context) (err error) {
			ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			if h.InboxHandler, err = handlers.NewSQL(ctx, pool, s.sqlFunction); err != nil {
				return fmt.Errorf("%s: %w", sqlFn, err)
			}
			return nil
		}, nil
	case "http":
		if s.httpURL == "" {
			return nil, nil, fmt.Errorf("%s is required with --handler http", url)
		}
		handlerTimeout := cmp.Or(max(s.cfg.Inbox.HandlerTimeout, 0), pgrelay.DefaultHandlerTimeout)
		if s.httpTimeout <= 0 || s.httpTimeout >= handlerTimeout {
			return nil, nil, fmt.Errorf("%s %s must be positive and shorter than %s %s",
				opts.Of(&s.httpTimeout), s.httpTimeout, opts.Name("Inbox.HandlerTimeout"), handlerTimeout)
		}
		h, err := handlers.NewHTTP(handlers.HTTPConfig{URL: s.httpURL, Timeout: s.httpTimeout, Recorder: pool, Logger: log})
		if err != nil {
			return nil, nil, errors.New(strings.Replace(err.Error(), "HTTPConfig.URL", url, 1))
		}
		return h, none, nil
	default:
		return nil, nil, fmt.Errorf("%s %q: want ledger, sql or http", handler, s.handler)
	}
}

// sqlHandler is the sql handler, set once its function is found (Run
// calls it only after).
type sqlHandler struct{ pgrelay.InboxHandler }

// checkDatabase fails start-up when the database cannot be reached (the
// consumer's Run checks the migrations). The ledger handler also needs the
// example schema.
func checkDatabase(ctx context.Context, pool *pgxpool.Pool, dbs cli.DBSettings, ledgerHandler bool, urlName string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := dbs.Reach(ctx, pool); err != nil {
		return err
	}
	if !ledgerHandler {
		return nil
	}
	return checkExampleSchema(ctx, pool, urlName)
}

// shutdownTracing flushes the spans still buffered, waiting 5s at most.
func shutdownTracing(tp *otelenv.Provider, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := tp.Shutdown(ctx); err != nil {
		log.Warn("flush traces", slog.Any("error", err))
	}
}
