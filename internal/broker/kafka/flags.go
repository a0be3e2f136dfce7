package kafka

import (
	"strings"
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/pgrelay/pgrelay/internal/cli"
)

// Settings are the Kafka adapter's command-line settings, each defaulted
// from its environment variable; Config turns them into a Config.
type Settings struct {
	Brokers         string
	TopicPrefix     string
	Group           string
	Topics          string
	MaxInFlight     int
	MaxMessageBytes int
	DeliveryTimeout time.Duration
	SessionTimeout  time.Duration
}

// EnvKinds lists the typed environment variables of the Kafka settings, for
// cli.ValidateEnv.
var EnvKinds = map[string]string{
	"KAFKA_MAX_IN_FLIGHT":     "int",
	"KAFKA_MAX_MESSAGE_BYTES": "int",
	"KAFKA_DELIVERY_TIMEOUT":  "duration",
	"KAFKA_SESSION_TIMEOUT":   "duration",
}

// BindFlags registers the Kafka flags on f: the shared ones, plus the
// publisher's (relay) or the consumer group's (consumer).
func BindFlags(f *pflag.FlagSet, s *Settings, consumer bool) {
	d := Config{}.WithDefaults()
	f.StringVar(&s.Brokers, "kafka-brokers", cli.EnvString("KAFKA_BROKERS", ""),
		"Kafka seed brokers, host:port,... (env KAFKA_BROKERS); required with --broker kafka")
	f.StringVar(&s.TopicPrefix, "kafka-topic-prefix", cli.EnvString("KAFKA_TOPIC_PREFIX", d.TopicPrefix),
		"Kafka topic of an event: <prefix>.<topic> (env KAFKA_TOPIC_PREFIX)")
	if consumer {
		f.StringVar(&s.Group, "kafka-group", cli.EnvString("KAFKA_GROUP", d.Group),
			"Kafka consumer group (env KAFKA_GROUP)")
		f.StringVar(&s.Topics, "kafka-topics", cli.EnvString("KAFKA_TOPICS", ""),
			"pgrelay topics to consume, comma-separated; empty consumes every <prefix>.* topic (env KAFKA_TOPICS)")
		f.DurationVar(&s.SessionTimeout, "kafka-session-timeout", cli.EnvDuration("KAFKA_SESSION_TIMEOUT", d.SessionTimeout),
			"consumer group session timeout: a member silent this long loses its partitions (env KAFKA_SESSION_TIMEOUT)")
		return
	}
	f.IntVar(&s.MaxInFlight, "kafka-max-in-flight", cli.EnvInt("KAFKA_MAX_IN_FLIGHT", d.MaxInFlight),
		"records awaiting acknowledgement, one per key (env KAFKA_MAX_IN_FLIGHT)")
	f.IntVar(&s.MaxMessageBytes, "kafka-max-message-bytes", cli.EnvInt("KAFKA_MAX_MESSAGE_BYTES", d.MaxMessageBytes),
		"largest record sent; a larger event goes dead; keep it at or below the topics' max.message.bytes (env KAFKA_MAX_MESSAGE_BYTES)")
	f.DurationVar(&s.DeliveryTimeout, "kafka-delivery-timeout", cli.EnvDuration("KAFKA_DELIVERY_TIMEOUT", d.DeliveryTimeout),
		"how long the producer retries a record before it fails and is retried in order by the relay (env KAFKA_DELIVERY_TIMEOUT)")
}

// Config returns the Config the settings describe (validated by
// NewPublisher and NewSubscriber, naming the flags).
func (s Settings) Config(log *zap.Logger) Config {
	return Config{
		Brokers:         splitList(s.Brokers),
		TopicPrefix:     s.TopicPrefix,
		Group:           s.Group,
		Topics:          splitList(s.Topics),
		MaxInFlight:     s.MaxInFlight,
		MaxMessageBytes: s.MaxMessageBytes,
		DeliveryTimeout: s.DeliveryTimeout,
		SessionTimeout:  s.SessionTimeout,
		Logger:          log,
	}
}

func splitList(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}
