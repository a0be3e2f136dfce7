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
	"github.com/pgrelay/pgrelay/broker/nats"
	"github.com/pgrelay/pgrelay/internal/natsserver"
	"github.com/pgrelay/pgrelay/internal/setting"
)

// NATSBroker is NATS JetStream: the relay publishes to a stream (or starts
// an embedded server when no --nats-url is given), the consumer reads a
// durable pull consumer of it.
func NATSBroker() Broker {
	return Broker{Name: "nats", BindRelay: bindNATSRelay, BindConsumer: bindNATSConsumer}
}

// natsRelay is the relay's NATS settings.
type natsRelay struct {
	url            string
	embeddedDir    string
	embeddedListen string
	stream         string
	subjectPrefix  string
	createStream   bool
	streamMaxAge   time.Duration
	streamReplicas int
	ackTimeout     time.Duration
	wireFormat     broker.WireFormat
	ceSource       string
}

// SetWire implements WireSide.
func (s *natsRelay) SetWire(f broker.WireFormat, source string) { s.wireFormat, s.ceSource = f, source }

var natsRelayEnvKinds = map[string]string{
	"RELAY_CREATE_STREAM":   "bool",
	"RELAY_STREAM_MAX_AGE":  "duration",
	"RELAY_STREAM_REPLICAS": "int",
	"RELAY_ACK_TIMEOUT":     "duration",
}

// natsRelayFlags names the relay's flags that set nats.Config's
// fields.
var natsRelayFlags = map[string]string{
	"SubjectPrefix":   "--subject-prefix (RELAY_SUBJECT_PREFIX)",
	"Stream":          "--stream (RELAY_STREAM)",
	"AckTimeout":      "--ack-timeout (RELAY_ACK_TIMEOUT)",
	"StreamReplicas":  "--stream-replicas (RELAY_STREAM_REPLICAS)",
	"DuplicateWindow": "the stream's duplicate window",
	"URL":             "--nats-url (NATS_URL)",
}

func natsRelayNames(err error) error {
	return setting.Name(err, "", func(f string) string { return natsRelayFlags[f] })
}

func bindNATSRelay(f *pflag.FlagSet) RelaySide {
	s := &natsRelay{}
	f.StringVar(&s.url, "nats-url", EnvString("NATS_URL", ""), "--broker nats: NATS server URL; empty starts an embedded NATS server (env NATS_URL)")
	f.StringVar(&s.embeddedDir, "embedded-nats-dir", EnvString("RELAY_EMBEDDED_NATS_DIR", "./.pgrelay/nats"), "--broker nats: JetStream data directory of the embedded NATS server (env RELAY_EMBEDDED_NATS_DIR)")
	f.StringVar(&s.embeddedListen, "embedded-nats-listen", EnvString("RELAY_EMBEDDED_NATS_LISTEN", "127.0.0.1:4222"), "--broker nats: host:port the embedded NATS server listens on (env RELAY_EMBEDDED_NATS_LISTEN)")
	f.StringVar(&s.stream, "stream", EnvString("RELAY_STREAM", nats.DefaultStream), "--broker nats: JetStream stream storing the subjects (env RELAY_STREAM)")
	f.StringVar(&s.subjectPrefix, "subject-prefix", EnvString("RELAY_SUBJECT_PREFIX", nats.DefaultSubjectPrefix), "--broker nats: subject prefix: topic orders goes to <prefix>.orders (env RELAY_SUBJECT_PREFIX)")
	f.BoolVar(&s.createStream, "create-stream", EnvBool("RELAY_CREATE_STREAM", false), "--broker nats: create the stream (subjects <prefix>.>) if missing, never changing an existing one; always on with the embedded server (env RELAY_CREATE_STREAM)")
	f.DurationVar(&s.streamMaxAge, "stream-max-age", EnvDuration("RELAY_STREAM_MAX_AGE", nats.DefaultStreamMaxAge), "--broker nats: MaxAge of a stream the relay creates; keep it within the consumer's --dedup-window; negative: no limit (env RELAY_STREAM_MAX_AGE)")
	f.IntVar(&s.streamReplicas, "stream-replicas", EnvInt("RELAY_STREAM_REPLICAS", 1), "--broker nats: replicas of a stream the relay creates: 3 on a JetStream cluster survives a node loss; 1 on a single server (env RELAY_STREAM_REPLICAS)")
	f.DurationVar(&s.ackTimeout, "ack-timeout", EnvDuration("RELAY_ACK_TIMEOUT", 5*time.Second), "--broker nats: longest wait for one JetStream acknowledgement (env RELAY_ACK_TIMEOUT)")
	return s
}

func (s *natsRelay) config(url string, createStream bool, log *slog.Logger) nats.Config {
	return nats.Config{URL: url, SubjectPrefix: s.subjectPrefix, Stream: s.stream, CreateStream: createStream,
		StreamMaxAge: s.streamMaxAge, StreamReplicas: s.streamReplicas, AckTimeout: s.ackTimeout, Logger: log,
		WireFormat: s.wireFormat, CloudEventsSource: s.ceSource}
}

func (s *natsRelay) Check() error {
	if err := ValidateEnv(natsRelayEnvKinds); err != nil {
		return err
	}
	if s.ackTimeout <= 0 {
		return fmt.Errorf("--ack-timeout (RELAY_ACK_TIMEOUT) must be positive, got %s", s.ackTimeout)
	}
	// The URL is checked by connecting; the rest needs no server.
	if err := s.config("nats://unused", false, nil).ValidatePublisher(); err != nil {
		return natsRelayNames(err)
	}
	return nil
}

func (s *natsRelay) Open(ctx context.Context, log *slog.Logger) (*RelayBroker, error) {
	url, createStream := s.url, s.createStream
	var stop func()
	if url == "" {
		srv, u, err := natsserver.Start(natsserver.Config{StoreDir: s.embeddedDir, Listen: s.embeddedListen})
		if err != nil {
			return nil, fmt.Errorf("--embedded-nats-listen/--embedded-nats-dir: %w", err)
		}
		stop = func() {
			srv.Shutdown()
			srv.WaitForShutdown()
		}
		log.Info("embedded NATS JetStream server started", slog.String("url", u), slog.String("store_dir", s.embeddedDir))
		url, createStream = u, true
	}
	pub, err := nats.NewPublisher(ctx, s.config(url, createStream, log))
	if err != nil {
		if stop != nil {
			stop()
		}
		if fe := (*setting.FieldError)(nil); errors.As(err, &fe) {
			return nil, natsRelayNames(err)
		}
		return nil, fmt.Errorf("--nats-url (NATS_URL): %w", err)
	}
	return &RelayBroker{
		Publisher: pub,
		Healthy: func(context.Context) error {
			if !pub.Conn().IsConnected() {
				return errors.New("not connected to NATS")
			}
			return nil
		},
		Close: func() {
			_ = pub.Close()
			if stop != nil {
				stop()
			}
		},
	}, nil
}

// natsConsumer is the consumer's NATS settings.
type natsConsumer struct {
	url           string
	stream        string
	subjectPrefix string
	createStream  bool
	durable       string
	filterSubject string
	ackWait       time.Duration
	allowReplay   bool
}

var natsConsumerEnvKinds = map[string]string{
	"CONSUMER_CREATE_STREAM":                    "bool",
	"CONSUMER_ACK_WAIT":                         "duration",
	"CONSUMER_ALLOW_REPLAY_BEYOND_DEDUP_WINDOW": "bool",
}

// natsConsumerFlags names the consumer's flags that set
// nats.Config's fields.
var natsConsumerFlags = map[string]string{
	"URL":                          "--nats-url (NATS_URL)",
	"Stream":                       "--stream (CONSUMER_STREAM)",
	"SubjectPrefix":                "--subject-prefix (CONSUMER_SUBJECT_PREFIX)",
	"Durable":                      "--durable (CONSUMER_DURABLE)",
	"AckWait":                      "--ack-wait (CONSUMER_ACK_WAIT)",
	"AllowReplayBeyondDedupWindow": "--allow-replay-beyond-dedup-window (CONSUMER_ALLOW_REPLAY_BEYOND_DEDUP_WINDOW)",
}

func bindNATSConsumer(f *pflag.FlagSet) ConsumerSide {
	s := &natsConsumer{}
	f.StringVar(&s.url, "nats-url", EnvString("NATS_URL", "nats://127.0.0.1:4222"), "--broker nats: NATS server URL(s), comma-separated (env NATS_URL)")
	f.StringVar(&s.stream, "stream", EnvString("CONSUMER_STREAM", nats.DefaultStream), "--broker nats: JetStream stream to consume (env CONSUMER_STREAM)")
	f.StringVar(&s.subjectPrefix, "subject-prefix", EnvString("CONSUMER_SUBJECT_PREFIX", nats.DefaultSubjectPrefix), "--broker nats: subject prefix the relay publishes under (env CONSUMER_SUBJECT_PREFIX)")
	f.BoolVar(&s.createStream, "create-stream", EnvBool("CONSUMER_CREATE_STREAM", false), "--broker nats: create the stream when missing instead of waiting for the relay (env CONSUMER_CREATE_STREAM)")
	f.StringVar(&s.durable, "durable", EnvString("CONSUMER_DURABLE", ""), "--broker nats: durable consumer name; instances sharing it share the work (default "+nats.DefaultDurable+", or "+nats.DefaultDurable+"-<handler-name> for a named handler) (env CONSUMER_DURABLE)")
	f.StringVar(&s.filterSubject, "filter-subject", EnvString("CONSUMER_FILTER_SUBJECT", ""), "--broker nats: subjects to consume (default <subject-prefix>.>) (env CONSUMER_FILTER_SUBJECT)")
	f.DurationVar(&s.ackWait, "ack-wait", EnvDuration("CONSUMER_ACK_WAIT", nats.DefaultAckWait), "--broker nats: JetStream redelivers a message not acknowledged within this (env CONSUMER_ACK_WAIT)")
	f.BoolVar(&s.allowReplay, "allow-replay-beyond-dedup-window", EnvBool("CONSUMER_ALLOW_REPLAY_BEYOND_DEDUP_WINDOW", false), "--broker nats: run on a stream keeping messages longer than --dedup-window (or forever), where a replay could apply an event twice (env CONSUMER_ALLOW_REPLAY_BEYOND_DEDUP_WINDOW)")
	return s
}

func (s *natsConsumer) config(opts SubscriberOptions) nats.Config {
	durable := s.durable
	if durable == "" && handlerNamed(opts.HandlerName) && !strings.ContainsAny(opts.HandlerName, " \t\r\n*>") {
		// A named handler gets its own durable: each handler receives every
		// message, whatever other handlers' consumers acknowledge.
		durable = nats.DefaultDurable + "-" + strings.ReplaceAll(opts.HandlerName, ".", "_")
	}
	if durable == "" {
		durable = nats.DefaultDurable
	}
	c := nats.Config{URL: s.url, Stream: s.stream, SubjectPrefix: s.subjectPrefix, CreateStream: s.createStream,
		Durable: durable, FilterSubject: s.filterSubject, DedupWindow: opts.DedupWindow,
		AllowReplayBeyondDedupWindow: s.allowReplay, AckWait: s.ackWait, MaxPayloadBytes: opts.MaxPayloadBytes,
		Logger: opts.Logger}
	if opts.BatchSize >= 1 { // derived from it: only once that is valid
		c.MaxAckPending = 10 * opts.BatchSize
	}
	return c
}

func (s *natsConsumer) Check(opts SubscriberOptions) error {
	if err := ValidateEnv(natsConsumerEnvKinds); err != nil {
		return err
	}
	if err := s.config(opts).ValidateSubscriber(); err != nil {
		return opts.names(err, natsConsumerFlags)
	}
	return nil
}

func (s *natsConsumer) Subscribe(opts SubscriberOptions) func(context.Context) (broker.Subscriber, error) {
	cfg := s.config(opts)
	names := func(err error) error { return opts.names(err, natsConsumerFlags) }
	return func(ctx context.Context) (broker.Subscriber, error) {
		sub, err := nats.NewSubscriber(ctx, cfg)
		if err != nil {
			return nil, names(err)
		}
		return &namedSubscriber{Subscriber: sub, names: names}, nil
	}
}

// namedSubscriber renames the settings a subscriber's permanent fetch
// errors name (a stream outliving the dedup window) to the flags that set
// them.
type namedSubscriber struct {
	broker.Subscriber
	names func(error) error
}

func (s *namedSubscriber) Fetch(ctx context.Context, max int, maxWait time.Duration) ([]broker.Delivery, error) {
	ds, err := s.Subscriber.Fetch(ctx, max, maxWait)
	if err != nil && broker.IsTerminal(err) {
		var perm *broker.TerminalError
		if errors.As(err, &perm) {
			err = broker.Terminal(s.names(perm.Err))
		}
	}
	return ds, err
}

// Retention forwards to the subscriber's (broker.RetentionReporter), for the
// web console.
func (s *namedSubscriber) Retention(ctx context.Context) (broker.Retention, error) {
	rr, ok := s.Subscriber.(broker.RetentionReporter)
	if !ok {
		return broker.Retention{}, errors.New("the subscriber does not report its broker's retention")
	}
	return rr.Retention(ctx)
}

// handlerNamed reports whether the consumer runs a named handler (not the
// default one). A named handler reads from a broker subscription of its own
// (NATS durable, Kafka consumer group, RabbitMQ queue) unless one is given:
// sharing one with another handler would split the messages between them.
func handlerNamed(name string) bool { return name != "" && name != "default" }
