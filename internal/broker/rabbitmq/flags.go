package rabbitmq

import (
	"errors"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/pgrelay/pgrelay/internal/cli"
)

// Sides of Flags: the relay publishes, the consumer subscribes.
const (
	SideRelay    = "relay"
	SideConsumer = "consumer"
)

// Flags are the RabbitMQ settings of the relay or consumer command, as flags
// whose defaults come from the environment (AMQP_*).
type Flags struct {
	side string
	cfg  Config
}

// flagNames maps Config fields onto the flags and environment variables that
// set them, so that a validation error names what the user sets.
var flagNames = []struct{ field, setting string }{
	{"Config.URL", "--amqp-url (AMQP_URL)"},
	{"Config.Exchange", "--amqp-exchange (AMQP_EXCHANGE)"},
	{"Config.QueueType", "--amqp-queue-type (AMQP_QUEUE_TYPE)"},
	{"Config.Queue", "--amqp-queue (AMQP_QUEUE)"},
	{"Config.BindingKey", "--amqp-binding-key (AMQP_BINDING_KEY)"},
	{"Config.SkipDeclare", "--amqp-skip-declare (AMQP_SKIP_DECLARE)"},
	{"Config.Prefetch", "--amqp-prefetch (AMQP_PREFETCH)"},
	{"Config.MaxInFlight", "--amqp-max-in-flight (AMQP_MAX_IN_FLIGHT)"},
	{"Config.ConfirmTimeout", "--amqp-confirm-timeout (AMQP_CONFIRM_TIMEOUT)"},
	{"Config.MaxMessageBytes", "--amqp-max-message-bytes (AMQP_MAX_MESSAGE_BYTES)"},
}

// EnvKinds are the AMQP_* variables that must parse, for cli.ValidateEnv.
var EnvKinds = map[string]string{
	"AMQP_SKIP_DECLARE":      "bool",
	"AMQP_PREFETCH":          "int",
	"AMQP_MAX_IN_FLIGHT":     "int",
	"AMQP_CONFIRM_TIMEOUT":   "duration",
	"AMQP_MAX_MESSAGE_BYTES": "int",
}

// BindFlags adds the RabbitMQ flags of side (SideRelay or SideConsumer) to f:
// the connection and topology for both, the prefetch for the consumer, the
// confirm window, timeout and size limit for the relay.
func BindFlags(f *pflag.FlagSet, side string) *Flags {
	fl := &Flags{side: side}
	c := &fl.cfg
	f.StringVar(&c.URL, "amqp-url", cli.EnvString("AMQP_URL", ""), "RabbitMQ URL, amqp://user:password@host:5672/vhost, with --broker rabbitmq (env AMQP_URL); required then")
	f.StringVar(&c.Exchange, "amqp-exchange", cli.EnvString("AMQP_EXCHANGE", "pgrelay"), "durable topic exchange events are published to, routing key = topic (env AMQP_EXCHANGE)")
	f.StringVar(&c.Queue, "amqp-queue", cli.EnvString("AMQP_QUEUE", "pgrelay"), "durable queue bound to the exchange that the consumer reads; the relay declares it too (env AMQP_QUEUE)")
	f.StringVar(&c.BindingKey, "amqp-binding-key", cli.EnvString("AMQP_BINDING_KEY", "#"), "binding of the queue to the exchange: # for every topic (env AMQP_BINDING_KEY)")
	f.StringVar(&c.QueueType, "amqp-queue-type", cli.EnvString("AMQP_QUEUE_TYPE", QueueTypeAuto), "type a missing queue is declared with: auto (quorum where supported), quorum or classic (env AMQP_QUEUE_TYPE)")
	f.BoolVar(&c.SkipDeclare, "amqp-skip-declare", cli.EnvBool("AMQP_SKIP_DECLARE", false), "declare nothing: the exchange, queue and binding must exist (env AMQP_SKIP_DECLARE)")
	switch side {
	case SideConsumer:
		f.IntVar(&c.Prefetch, "amqp-prefetch", cli.EnvInt("AMQP_PREFETCH", 256), "unacknowledged deliveries RabbitMQ sends ahead (basic.qos); at least --batch-size (env AMQP_PREFETCH)")
	default:
		f.IntVar(&c.MaxInFlight, "amqp-max-in-flight", cli.EnvInt("AMQP_MAX_IN_FLIGHT", 1024), "messages awaiting a publisher confirm, across keys (env AMQP_MAX_IN_FLIGHT)")
		f.DurationVar(&c.ConfirmTimeout, "amqp-confirm-timeout", cli.EnvDuration("AMQP_CONFIRM_TIMEOUT", 5*time.Second), "longest wait for a publisher confirm (env AMQP_CONFIRM_TIMEOUT)")
		f.IntVar(&c.MaxMessageBytes, "amqp-max-message-bytes", cli.EnvInt("AMQP_MAX_MESSAGE_BYTES", DefaultMaxMessageBytes), "largest payload published; keep it at most the server's max_message_size (env AMQP_MAX_MESSAGE_BYTES)")
	}
	return fl
}

// Config returns the settings as a validated Config with logger, or an
// error naming the flags at fault.
func (fl *Flags) Config(log *zap.Logger) (Config, error) {
	c := fl.cfg
	c.Logger = log
	c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		return Config{}, NameFlags(err)
	}
	return c, nil
}

// NameFlags rewrites the Config field names in err into the flags (and
// environment variables) that set them.
func NameFlags(err error) error {
	msg := err.Error()
	for _, f := range flagNames {
		msg = strings.ReplaceAll(msg, f.field, f.setting)
	}
	return errors.New(msg)
}
