package cli

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/kafka"
	"github.com/pgrelay/pgrelay/internal/setting"
)

// KafkaBroker is Apache Kafka: the relay publishes as an idempotent producer
// to "<prefix>.<topic>" topics, the consumer reads them as a consumer group.
func KafkaBroker() Broker {
	return Broker{Name: "kafka", BindRelay: bindKafkaRelay, BindConsumer: bindKafkaConsumer}
}

// kafkaEnvKinds lists the typed Kafka environment variables.
var kafkaEnvKinds = map[string]string{
	"KAFKA_MAX_IN_FLIGHT":                    "int",
	"KAFKA_MAX_MESSAGE_BYTES":                "int",
	"KAFKA_DELIVERY_TIMEOUT":                 "duration",
	"KAFKA_SESSION_TIMEOUT":                  "duration",
	"KAFKA_ALLOW_REPLAY_BEYOND_DEDUP_WINDOW": "bool",
}

// kafkaSettings are the Kafka flags of either command.
type kafkaSettings struct {
	brokers         string
	topicPrefix     string
	group           string
	topics          string
	maxInFlight     int
	maxMessageBytes int
	deliveryTimeout time.Duration
	sessionTimeout  time.Duration
	allowReplay     bool
	wireFormat      broker.WireFormat
	ceSource        string
}

// SetWire implements WireSide.
func (s *kafkaSettings) SetWire(f broker.WireFormat, source string) {
	s.wireFormat, s.ceSource = f, source
}

func bindKafkaCommon(f *pflag.FlagSet, s *kafkaSettings) {
	d := kafka.Config{}.WithDefaults()
	f.StringVar(&s.brokers, "kafka-brokers", EnvString("KAFKA_BROKERS", ""),
		"--broker kafka: seed brokers, host:port,...; required (env KAFKA_BROKERS)")
	f.StringVar(&s.topicPrefix, "kafka-topic-prefix", EnvString("KAFKA_TOPIC_PREFIX", d.TopicPrefix),
		"--broker kafka: an event of topic orders is in Kafka topic <prefix>.orders (env KAFKA_TOPIC_PREFIX)")
}

func bindKafkaRelay(f *pflag.FlagSet) RelaySide {
	s := &kafkaSettings{}
	d := kafka.Config{}.WithDefaults()
	bindKafkaCommon(f, s)
	f.IntVar(&s.maxInFlight, "kafka-max-in-flight", EnvInt("KAFKA_MAX_IN_FLIGHT", d.MaxInFlight),
		"--broker kafka: records awaiting acknowledgement, one per key at a time (env KAFKA_MAX_IN_FLIGHT)")
	f.IntVar(&s.maxMessageBytes, "kafka-max-message-bytes", EnvInt("KAFKA_MAX_MESSAGE_BYTES", d.MaxMessageBytes),
		"--broker kafka: largest record sent, a larger event goes dead; keep it at or below the topics' max.message.bytes (env KAFKA_MAX_MESSAGE_BYTES)")
	f.DurationVar(&s.deliveryTimeout, "kafka-delivery-timeout", EnvDuration("KAFKA_DELIVERY_TIMEOUT", d.DeliveryTimeout),
		"--broker kafka: how long the producer resends a record before it fails and the relay retries it in order (env KAFKA_DELIVERY_TIMEOUT)")
	return s
}

func bindKafkaConsumer(f *pflag.FlagSet) ConsumerSide {
	s := kafkaConsumerSide{&kafkaSettings{}}
	d := kafka.Config{}.WithDefaults()
	bindKafkaCommon(f, s.kafkaSettings)
	f.StringVar(&s.group, "kafka-group", EnvString("KAFKA_GROUP", ""),
		"--broker kafka: consumer group; instances sharing it share the partitions (default "+d.Group+", or "+d.Group+"-<handler-name> for a named handler) (env KAFKA_GROUP)")
	f.StringVar(&s.topics, "kafka-topics", EnvString("KAFKA_TOPICS", ""),
		"--broker kafka: pgrelay topics to consume, comma-separated; empty: every <prefix>.* topic (env KAFKA_TOPICS)")
	f.DurationVar(&s.sessionTimeout, "kafka-session-timeout", EnvDuration("KAFKA_SESSION_TIMEOUT", d.SessionTimeout),
		"--broker kafka: a group member silent this long loses its partitions (env KAFKA_SESSION_TIMEOUT)")
	f.BoolVar(&s.allowReplay, "kafka-allow-replay-beyond-dedup-window", EnvBool("KAFKA_ALLOW_REPLAY_BEYOND_DEDUP_WINDOW", false),
		"--broker kafka: run on topics keeping records longer than --dedup-window, where a group starting over could apply an event twice (env KAFKA_ALLOW_REPLAY_BEYOND_DEDUP_WINDOW)")
	return s
}

func (s *kafkaSettings) config(log *slog.Logger) kafka.Config {
	return kafka.Config{
		Brokers: splitList(s.brokers), TopicPrefix: s.topicPrefix, Group: s.group, Topics: splitList(s.topics),
		MaxInFlight: s.maxInFlight, MaxMessageBytes: s.maxMessageBytes, DeliveryTimeout: s.deliveryTimeout,
		SessionTimeout: s.sessionTimeout, AllowReplayBeyondDedupWindow: s.allowReplay, Logger: log,
		WireFormat: s.wireFormat, CloudEventsSource: s.ceSource,
	}
}

// Check implements RelaySide.
func (s *kafkaSettings) Check() error {
	if err := ValidateEnv(kafkaEnvKinds); err != nil {
		return err
	}
	return unprefixed(s.config(nil).WithDefaults().Validate())
}

// kafkaFlags names the flags that set kafka.Config's fields.
var kafkaFlags = map[string]string{
	"Brokers":                      "--kafka-brokers (KAFKA_BROKERS)",
	"TopicPrefix":                  "--kafka-topic-prefix (KAFKA_TOPIC_PREFIX)",
	"Group":                        "--kafka-group (KAFKA_GROUP)",
	"Topics":                       "--kafka-topics (KAFKA_TOPICS)",
	"MaxInFlight":                  "--kafka-max-in-flight (KAFKA_MAX_IN_FLIGHT)",
	"MaxMessageBytes":              "--kafka-max-message-bytes (KAFKA_MAX_MESSAGE_BYTES)",
	"DeliveryTimeout":              "--kafka-delivery-timeout (KAFKA_DELIVERY_TIMEOUT)",
	"SessionTimeout":               "--kafka-session-timeout (KAFKA_SESSION_TIMEOUT)",
	"AllowReplayBeyondDedupWindow": "--kafka-allow-replay-beyond-dedup-window (KAFKA_ALLOW_REPLAY_BEYOND_DEDUP_WINDOW)",
}

// unprefixed names the kafka.Config fields of err's setting errors as the
// flags that set them.
func unprefixed(err error) error {
	if err == nil {
		return nil
	}
	return setting.Name(err, "", func(f string) string { return kafkaFlags[f] })
}

// Open implements RelaySide.
func (s *kafkaSettings) Open(ctx context.Context, log *slog.Logger) (*RelayBroker, error) {
	pub, err := kafka.NewPublisher(ctx, s.config(log))
	if err != nil {
		return nil, unprefixed(err)
	}
	return &RelayBroker{Publisher: pub, Healthy: pub.Ping, Close: func() { _ = pub.Close() }}, nil
}

func (s *kafkaSettings) consumerConfig(opts SubscriberOptions) kafka.Config {
	c := s.config(opts.Logger)
	c.DedupWindow, c.MaxPayloadBytes = opts.DedupWindow, opts.MaxPayloadBytes
	if c.Group == "" && handlerNamed(opts.HandlerName) {
		// A named handler's consumers form a group of their own: each
		// handler receives every record.
		c.Group = kafka.Config{}.WithDefaults().Group + "-" + opts.HandlerName
	}
	return c.WithDefaults()
}

// kafkaConsumerSide is kafkaSettings as a ConsumerSide (its Check takes options).
type kafkaConsumerSide struct{ *kafkaSettings }

func (s kafkaConsumerSide) Check(opts SubscriberOptions) error {
	if err := ValidateEnv(kafkaEnvKinds); err != nil {
		return err
	}
	return opts.names(s.consumerConfig(opts).Validate(), kafkaFlags)
}

func (s kafkaConsumerSide) Subscribe(opts SubscriberOptions) func(context.Context) (broker.Subscriber, error) {
	cfg := s.consumerConfig(opts)
	return func(ctx context.Context) (broker.Subscriber, error) {
		sub, err := kafka.NewSubscriber(ctx, cfg)
		if err != nil {
			return nil, opts.names(err, kafkaFlags)
		}
		return sub, nil
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
