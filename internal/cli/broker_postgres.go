package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/spf13/pflag"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/postgres"
	"github.com/pgrelay/pgrelay/internal/setting"
)

// PostgresBroker is PostgreSQL as the broker: the relay stores events
// straight into the inbox of a target database (its own by default), the
// consumer of that database runs its inbox workers without a subscriber
// (see docs/postgres-broker.md).
func PostgresBroker() Broker {
	return Broker{Name: "postgres", BindRelay: bindPostgresRelay, BindConsumer: bindPostgresConsumer}
}

// DatabaseDefault is a relay side whose settings default to the relay's own
// database: the relay tells it its --database-url before Check.
type DatabaseDefault interface {
	DefaultDatabase(url string)
}

// DirectSide is a consumer side without a subscriber: the relay stores into
// the consumer's inbox (consumer.Config.Direct).
type DirectSide interface {
	// Register records target, taking the topics --pg-topics names, in
	// pool's pgrelay.inbox_subscriptions (consumer.Config.Register).
	Register(pool postgres.DB, target pgrelay.Target) func(context.Context) error
}

var postgresFlags = map[string]string{
	"URL":             "--pg-target-url (PG_TARGET_URL)",
	"Pool":            "--pg-target-url (PG_TARGET_URL)",
	"MaxConns":        "--pg-max-conns (PG_MAX_CONNS)",
	"MaxMessageBytes": "--pg-max-message-bytes (PG_MAX_MESSAGE_BYTES)",
}

var postgresEnvKinds = map[string]string{
	"PG_MAX_CONNS":         "int",
	"PG_MAX_MESSAGE_BYTES": "int",
}

func postgresNames(err error) error {
	return setting.Name(err, "", func(f string) string { return postgresFlags[f] })
}

// postgresRelay is the relay's settings for --broker postgres.
type postgresRelay struct {
	cfg      postgres.Config
	maxConns int
}

func bindPostgresRelay(f *pflag.FlagSet) RelaySide {
	s := &postgresRelay{}
	f.StringVar(&s.cfg.URL, "pg-target-url", EnvString("PG_TARGET_URL", ""), "--broker postgres: the database whose inbox events are stored in, migrated with pgrelay's migrations (default: --database-url, the relay's own) (env PG_TARGET_URL)")
	f.IntVar(&s.maxConns, "pg-max-conns", EnvInt("PG_MAX_CONNS", int(postgres.DefaultMaxConns)), "--broker postgres: connections to the target database, one per batch being stored (env PG_MAX_CONNS)")
	f.IntVar(&s.cfg.MaxMessageBytes, "pg-max-message-bytes", EnvInt("PG_MAX_MESSAGE_BYTES", postgres.DefaultMaxMessageBytes), "--broker postgres: largest payload stored; larger ones are dead-lettered (env PG_MAX_MESSAGE_BYTES)")
	return s
}

func (s *postgresRelay) DefaultDatabase(url string) {
	if s.cfg.URL == "" {
		s.cfg.URL = url
	}
}

func (s *postgresRelay) config(log *slog.Logger) postgres.Config {
	c := s.cfg
	c.MaxConns = int32(min(max(s.maxConns, 0), 10000))
	c.Logger = log
	return c.WithDefaults()
}

func (s *postgresRelay) Check() error {
	if err := ValidateEnv(postgresEnvKinds); err != nil {
		return err
	}
	if s.maxConns < 1 || s.maxConns > 10000 {
		return fmt.Errorf("--pg-max-conns (PG_MAX_CONNS) must be between 1 and 10000, got %d", s.maxConns)
	}
	if err := s.config(nil).Validate(); err != nil {
		return postgresNames(err)
	}
	return nil
}

func (s *postgresRelay) Open(ctx context.Context, log *slog.Logger) (*RelayBroker, error) {
	pub, err := postgres.NewPublisher(ctx, s.config(log))
	if err != nil {
		if fe := (*setting.FieldError)(nil); errors.As(err, &fe) {
			return nil, postgresNames(err)
		}
		return nil, fmt.Errorf("--pg-target-url (PG_TARGET_URL): %w", err)
	}
	return &RelayBroker{Publisher: pub, Healthy: pub.Healthy, Close: func() { _ = pub.Close() }}, nil
}

// postgresConsumer is the consumer's settings for --broker postgres.
type postgresConsumer struct{ topicList string }

func bindPostgresConsumer(f *pflag.FlagSet) ConsumerSide {
	s := &postgresConsumer{}
	f.StringVar(&s.topicList, "pg-topics", EnvString("PG_TOPICS", ""), "--broker postgres: comma-separated topics the handler takes; empty: every topic (env PG_TOPICS)")
	return s
}

func (s *postgresConsumer) Register(pool postgres.DB, target pgrelay.Target) func(context.Context) error {
	return postgres.RegisterTargets(pool, s.topics(), target)
}

// topics are the topics --pg-topics names (nil: every topic).
func (s *postgresConsumer) topics() []string {
	var out []string
	for t := range strings.SplitSeq(s.topicList, ",") {
		if t = strings.TrimSpace(t); t != "" {
			out = append(out, t)
		}
	}
	return out
}

func (s *postgresConsumer) Check(SubscriberOptions) error { return nil }

// Subscribe returns nil: there is no subscriber (DirectSide).
func (s *postgresConsumer) Subscribe(SubscriberOptions) func(context.Context) (broker.Subscriber, error) {
	return nil
}
