// Command consumer receives events from NATS JetStream into the pgrelay inbox
// and applies them to the ledger exactly once.
//
//	consumer run             consume until SIGTERM
//	consumer migrate up      apply the database migrations
//	consumer healthcheck     probe a running consumer's /healthz
//
// Every flag can also be set through the environment variable named in its
// help text.
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/pgrelay/pgrelay/internal/cli"
	"github.com/pgrelay/pgrelay/internal/consumer"
	"github.com/pgrelay/pgrelay/internal/inbox"
	"github.com/pgrelay/pgrelay/internal/ledger"
)

func main() {
	if err := newRootCommand().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		os.Exit(1)
	}
}

// settings are the command line, each defaulted from its environment variable.
type settings struct {
	databaseURL     string
	natsURL         string
	stream          string
	subjectPrefix   string
	createStream    bool
	durable         string
	filterSubject   string
	batchSize       int
	maxWait         time.Duration
	ackWait         time.Duration
	maxPayloadBytes int
	workers         int
	workerBatchSize int
	maxAttempts     int
	httpAddr        string
	logLevel        string
	logFormat       string
}

// envKinds lists the typed environment variables, checked at start-up.
var envKinds = map[string]string{
	"CONSUMER_CREATE_STREAM":      "bool",
	"CONSUMER_BATCH_SIZE":         "int",
	"CONSUMER_MAX_WAIT":           "duration",
	"CONSUMER_ACK_WAIT":           "duration",
	"CONSUMER_MAX_PAYLOAD_BYTES":  "int",
	"CONSUMER_WORKERS":            "int",
	"CONSUMER_WORKER_BATCH_SIZE":  "int",
	"CONSUMER_MAX_ATTEMPTS":       "int",
	"CONSUMER_STATS_INTERVAL_SEC": "int",
}

func newRootCommand() *cobra.Command {
	var s settings
	root := &cobra.Command{
		Use:   "consumer",
		Short: "Receive events from NATS JetStream into the inbox and apply them exactly once",
		Long: `consumer pulls events from a JetStream durable consumer, stores each fetched
batch in the PostgreSQL inbox in one transaction (deduplicated by event id),
commits, then acknowledges the batch. Inbox workers in the same process apply
each event to the ledger exactly once. Malformed messages are stored dead with
the reason and acknowledged, never dropped.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	pf := root.PersistentFlags()
	pf.StringVar(&s.databaseURL, "database-url", cli.EnvString("DATABASE_URL", ""), "PostgreSQL URL (DATABASE_URL)")
	pf.StringVar(&s.logLevel, "log-level", cli.EnvString("LOG_LEVEL", "info"), "log level: debug, info, warn, error (LOG_LEVEL)")
	pf.StringVar(&s.logFormat, "log-format", cli.EnvString("LOG_FORMAT", "json"), "log format: json or console (LOG_FORMAT)")
	pf.StringVar(&s.httpAddr, "http-addr", cli.EnvString("CONSUMER_HTTP_ADDR", "127.0.0.1:8081"), "address serving /healthz and /stats; empty disables (CONSUMER_HTTP_ADDR)")

	run := &cobra.Command{
		Use:   "run",
		Short: "Consume until SIGTERM or SIGINT",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return runConsumer(cmd.Context(), s) },
	}
	f := run.Flags()
	f.StringVar(&s.natsURL, "nats-url", cli.EnvString("NATS_URL", "nats://127.0.0.1:4222"), "NATS server URL(s), comma-separated (NATS_URL)")
	f.StringVar(&s.stream, "stream", cli.EnvString("CONSUMER_STREAM", "PGRELAY"), "JetStream stream to consume (CONSUMER_STREAM)")
	f.StringVar(&s.subjectPrefix, "subject-prefix", cli.EnvString("CONSUMER_SUBJECT_PREFIX", "pgrelay"), "subject prefix the relay publishes under (CONSUMER_SUBJECT_PREFIX)")
	f.BoolVar(&s.createStream, "create-stream", cli.EnvBool("CONSUMER_CREATE_STREAM", false), "create the stream when missing instead of waiting for the relay (CONSUMER_CREATE_STREAM)")
	f.StringVar(&s.durable, "durable", cli.EnvString("CONSUMER_DURABLE", "pgrelay-consumer"), "durable consumer name; instances sharing it share the work (CONSUMER_DURABLE)")
	f.StringVar(&s.filterSubject, "filter-subject", cli.EnvString("CONSUMER_FILTER_SUBJECT", ""), "subjects to consume (default <subject-prefix>.>) (CONSUMER_FILTER_SUBJECT)")
	f.IntVar(&s.batchSize, "batch-size", cli.EnvInt("CONSUMER_BATCH_SIZE", 100), "messages per fetch, stored in one transaction (CONSUMER_BATCH_SIZE)")
	f.DurationVar(&s.maxWait, "max-wait", cli.EnvDuration("CONSUMER_MAX_WAIT", 500*time.Millisecond), "longest wait for a full batch (CONSUMER_MAX_WAIT)")
	f.DurationVar(&s.ackWait, "ack-wait", cli.EnvDuration("CONSUMER_ACK_WAIT", 30*time.Second), "JetStream redelivers a message not acknowledged within this (CONSUMER_ACK_WAIT)")
	f.IntVar(&s.maxPayloadBytes, "max-payload-bytes", cli.EnvInt("CONSUMER_MAX_PAYLOAD_BYTES", 1<<20), "larger payloads are stored dead (CONSUMER_MAX_PAYLOAD_BYTES)")
	f.IntVar(&s.workers, "workers", cli.EnvInt("CONSUMER_WORKERS", inbox.DefaultWorkers), "concurrent inbox worker batches (CONSUMER_WORKERS)")
	f.IntVar(&s.workerBatchSize, "worker-batch-size", cli.EnvInt("CONSUMER_WORKER_BATCH_SIZE", inbox.DefaultBatchSize), "events per inbox worker transaction (CONSUMER_WORKER_BATCH_SIZE)")
	f.IntVar(&s.maxAttempts, "max-attempts", cli.EnvInt("CONSUMER_MAX_ATTEMPTS", inbox.DefaultMaxAttempts), "handler attempts before an event goes dead (CONSUMER_MAX_ATTEMPTS)")

	health := &cobra.Command{
		Use:   "healthcheck",
		Short: "Exit 0 when the consumer at --http-addr reports healthy (for container health checks)",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return healthcheck(cmd.Context(), s.httpAddr) },
	}

	root.AddCommand(run, cli.MigrateCommand(&s.databaseURL), health)
	return root
}

func runConsumer(parent context.Context, s settings) error {
	if err := cli.ValidateEnv(envKinds); err != nil {
		return err
	}
	if s.databaseURL == "" {
		return errors.New("--database-url (DATABASE_URL) is required")
	}
	log, err := cli.NewLogger(s.logLevel, s.logFormat)
	if err != nil {
		return err
	}
	defer log.Sync() //nolint:errcheck

	ctx, stop := cli.SignalContext(parent)
	defer stop()

	poolCfg, err := pgxpool.ParseConfig(s.databaseURL)
	if err != nil {
		return fmt.Errorf("--database-url (DATABASE_URL): %w", err)
	}
	// Inbox workers each hold a connection; ingest needs one more.
	if min := int32(s.workers + 2); poolCfg.MaxConns < min {
		poolCfg.MaxConns = min
	}
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		return fmt.Errorf("--database-url (DATABASE_URL): %w", err)
	}
	defer pool.Close()

	c, err := consumer.New(consumer.Config{
		Pool:            pool,
		NATSURL:         s.natsURL,
		Stream:          s.stream,
		SubjectPrefix:   s.subjectPrefix,
		CreateStream:    s.createStream,
		Durable:         s.durable,
		FilterSubject:   s.filterSubject,
		BatchSize:       s.batchSize,
		MaxWait:         s.maxWait,
		AckWait:         s.ackWait,
		MaxPayloadBytes: s.maxPayloadBytes,
		StatsInterval:   time.Duration(cli.EnvInt("CONSUMER_STATS_INTERVAL_SEC", 30)) * time.Second,
		Inbox: inbox.Config{
			Handler:     ledger.Handler{},
			Workers:     s.workers,
			BatchSize:   s.workerBatchSize,
			MaxAttempts: s.maxAttempts,
		},
		Logger: log,
	})
	if err != nil {
		return err
	}

	if s.httpAddr != "" {
		ln, err := net.Listen("tcp", s.httpAddr)
		if err != nil {
			return fmt.Errorf("--http-addr (CONSUMER_HTTP_ADDR) %q: %w", s.httpAddr, err)
		}
		srv := &http.Server{Handler: c.HTTPHandler(), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
		}()
		log.Info("serving health and stats", zap.String("addr", ln.Addr().String()))
	}
	return c.Run(ctx)
}

func healthcheck(ctx context.Context, addr string) error {
	if addr == "" {
		return errors.New("--http-addr (CONSUMER_HTTP_ADDR) is empty: nothing to probe")
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--http-addr (CONSUMER_HTTP_ADDR) %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1" // a listener on all interfaces is probed on loopback
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(host, port)+"/healthz", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("unhealthy: %s", resp.Status)
	}
	return nil
}
