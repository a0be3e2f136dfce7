package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/rabbitmq"
	"github.com/pgrelay/pgrelay/internal/setting"
)

// RabbitMQBroker is RabbitMQ: the relay publishes to a durable topic
// exchange with publisher confirms, the consumer reads a durable (quorum)
// queue bound to it; both declare the topology (see docs/rabbitmq.md).
func RabbitMQBroker() Broker {
	return Broker{Name: "rabbitmq", BindRelay: bindRabbitMQRelay, BindConsumer: bindRabbitMQConsumer}
}

// rabbitMQFlags names the flags that set rabbitmq.Config's fields.
var rabbitMQFlags = map[string]string{
	"URL":               "--amqp-url (AMQP_URL)",
	"Exchange":          "--amqp-exchange (AMQP_EXCHANGE)",
	"QueueType":         "--amqp-queue-type (AMQP_QUEUE_TYPE)",
	"Queue":             "--amqp-queue (AMQP_QUEUE)",
	"BindingKey":        "--amqp-binding-key (AMQP_BINDING_KEY)",
	"SkipDeclare":       "--amqp-skip-declare (AMQP_SKIP_DECLARE)",
	"Prefetch":          "--amqp-prefetch (AMQP_PREFETCH)",
	"MaxInFlight":       "--amqp-max-in-flight (AMQP_MAX_IN_FLIGHT)",
	"ConfirmTimeout":    "--amqp-confirm-timeout (AMQP_CONFIRM_TIMEOUT)",
	"MaxMessageBytes":   "--amqp-max-message-bytes (AMQP_MAX_MESSAGE_BYTES)",
	"CloudEventsPrefix": CEAMQPPrefixFlag,
}

// rabbitMQNames spells the rabbitmq.Config fields of err's
// *setting.FieldErrors as the flags that set them.
func rabbitMQNames(err error) error {
	return setting.Name(err, "", func(f string) string { return rabbitMQFlags[f] })
}

var rabbitMQEnvKinds = map[string]string{
	"AMQP_SKIP_DECLARE":      "bool",
	"AMQP_PREFETCH":          "int",
	"AMQP_MAX_IN_FLIGHT":     "int",
	"AMQP_CONFIRM_TIMEOUT":   "duration",
	"AMQP_MAX_MESSAGE_BYTES": "int",
}

// bindRabbitMQCommon binds the settings both sides have: the server and the
// topology.
func bindRabbitMQCommon(f *pflag.FlagSet, c *rabbitmq.Config) {
	f.StringVar(&c.URL, "amqp-url", EnvString("AMQP_URL", ""), "--broker rabbitmq: RabbitMQ URL, amqp://user:password@host:5672/vhost; required (env AMQP_URL)")
	f.StringVar(&c.Exchange, "amqp-exchange", EnvString("AMQP_EXCHANGE", "pgrelay"), "--broker rabbitmq: durable topic exchange events are published to, routing key = topic (env AMQP_EXCHANGE)")
	f.StringVar(&c.Queue, "amqp-queue", EnvString("AMQP_QUEUE", ""), "--broker rabbitmq: durable queue bound to the exchange, read by the consumer and declared by both (default pgrelay; a named handler's consumer: pgrelay-<handler-name>) (env AMQP_QUEUE)")
	f.StringVar(&c.BindingKey, "amqp-binding-key", EnvString("AMQP_BINDING_KEY", "#"), "--broker rabbitmq: binding of the queue to the exchange; # takes every topic (env AMQP_BINDING_KEY)")
	f.StringVar(&c.QueueType, "amqp-queue-type", EnvString("AMQP_QUEUE_TYPE", rabbitmq.QueueTypeAuto), "--broker rabbitmq: type a missing queue is declared with: auto (quorum where supported), quorum or classic (env AMQP_QUEUE_TYPE)")
	f.BoolVar(&c.SkipDeclare, "amqp-skip-declare", EnvBool("AMQP_SKIP_DECLARE", false), "--broker rabbitmq: declare nothing; the exchange, queue and binding must exist (env AMQP_SKIP_DECLARE)")
}

// rabbitMQRelay is the relay's RabbitMQ settings.
type rabbitMQRelay struct{ cfg rabbitmq.Config }

// SetWire implements WireSide.
func (s *rabbitMQRelay) SetWire(f broker.WireFormat, source string) {
	s.cfg.WireFormat, s.cfg.CloudEventsSource = f, source
}

func bindRabbitMQRelay(f *pflag.FlagSet) RelaySide {
	s := &rabbitMQRelay{}
	bindRabbitMQCommon(f, &s.cfg)
	f.IntVar(&s.cfg.MaxInFlight, "amqp-max-in-flight", EnvInt("AMQP_MAX_IN_FLIGHT", 1024), "--broker rabbitmq: messages awaiting a publisher confirm, across keys (env AMQP_MAX_IN_FLIGHT)")
	f.DurationVar(&s.cfg.ConfirmTimeout, "amqp-confirm-timeout", EnvDuration("AMQP_CONFIRM_TIMEOUT", 5*time.Second), "--broker rabbitmq: longest wait for one publisher confirm (env AMQP_CONFIRM_TIMEOUT)")
	bindCEAMQPPrefix(f, &s.cfg.CloudEventsPrefix)
	f.IntVar(&s.cfg.MaxMessageBytes, "amqp-max-message-bytes", EnvInt("AMQP_MAX_MESSAGE_BYTES", rabbitmq.DefaultMaxMessageBytes), "--broker rabbitmq: largest payload published, at most the server's max_message_size; larger ones are dead-lettered (env AMQP_MAX_MESSAGE_BYTES)")
	return s
}

func (s *rabbitMQRelay) config(log *slog.Logger) rabbitmq.Config {
	c := s.cfg
	c.Logger = log
	return c.WithDefaults()
}

func (s *rabbitMQRelay) Check() error {
	if err := ValidateEnv(rabbitMQEnvKinds); err != nil {
		return err
	}
	if s.cfg.ConfirmTimeout <= 0 {
		return fmt.Errorf("--amqp-confirm-timeout (AMQP_CONFIRM_TIMEOUT) must be positive, got %s", s.cfg.ConfirmTimeout)
	}
	if err := s.config(nil).Validate(); err != nil {
		return rabbitMQNames(err)
	}
	return nil
}

func (s *rabbitMQRelay) Open(ctx context.Context, log *slog.Logger) (*RelayBroker, error) {
	pub, err := rabbitmq.NewPublisher(ctx, s.config(log))
	if err != nil {
		return nil, rabbitMQOpenError(err)
	}
	return &RelayBroker{
		Publisher: pub,
		Healthy: func(context.Context) error {
			if !pub.Connected() {
				return errors.New("not connected to RabbitMQ")
			}
			return nil
		},
		Close: func() { _ = pub.Close() },
	}, nil
}

// rabbitMQConsumer is the consumer's RabbitMQ settings.
type rabbitMQConsumer struct{ cfg rabbitmq.Config }

func bindRabbitMQConsumer(f *pflag.FlagSet) ConsumerSide {
	s := &rabbitMQConsumer{}
	bindRabbitMQCommon(f, &s.cfg)
	f.IntVar(&s.cfg.Prefetch, "amqp-prefetch", EnvInt("AMQP_PREFETCH", 256), "--broker rabbitmq: unacknowledged deliveries RabbitMQ sends ahead (basic.qos), at least --batch-size (env AMQP_PREFETCH)")
	return s
}

func (s *rabbitMQConsumer) config(opts SubscriberOptions) rabbitmq.Config {
	c := s.cfg
	c.Logger = opts.Logger
	c.MaxPayloadBytes = opts.MaxPayloadBytes
	if c.Queue == "" && handlerNamed(opts.HandlerName) {
		// A named handler reads a queue of its own, bound like the default
		// one: each handler receives every message published once the queue
		// exists (its consumer declares it at start).
		c.Queue = rabbitmq.Config{}.WithDefaults().Queue + "-" + opts.HandlerName
	}
	return c.WithDefaults()
}

func (s *rabbitMQConsumer) Check(opts SubscriberOptions) error {
	if err := ValidateEnv(rabbitMQEnvKinds); err != nil {
		return err
	}
	c := s.config(opts)
	if err := c.Validate(); err != nil {
		return rabbitMQNames(err)
	}
	if opts.BatchSize > 0 && c.Prefetch < opts.BatchSize {
		return fmt.Errorf("%s %d is below %s %d: a fetched batch could never fill", rabbitMQFlags["Prefetch"], c.Prefetch, opts.Options.Name("FetchBatchSize"), opts.BatchSize)
	}
	return nil
}

func (s *rabbitMQConsumer) Subscribe(opts SubscriberOptions) func(context.Context) (broker.Subscriber, error) {
	cfg := s.config(opts)
	return func(ctx context.Context) (broker.Subscriber, error) {
		sub, err := rabbitmq.NewSubscriber(ctx, cfg)
		if err != nil {
			return nil, rabbitMQOpenError(err)
		}
		return sub, nil
	}
}

// rabbitMQOpenError names the settings of a failed start: those the error
// names (a topology that does not match), else the server's URL.
func rabbitMQOpenError(err error) error {
	if fe := (*setting.FieldError)(nil); errors.As(err, &fe) {
		return rabbitMQNames(err)
	}
	return errors.New("--amqp-url (AMQP_URL): " + strings.TrimPrefix(err.Error(), "rabbitmq: "))
}
