// Package nats is pgrelay's NATS JetStream adapter: a Publisher the relay
// publishes with (each event to "<SubjectPrefix>.<topic>", its event id as
// JetStream's dedup id Nats-Msg-Id, its metadata in Pgrelay-* headers) and a
// Subscriber the consumer fetches with (a durable pull consumer), both
// configured by one Config. It passes the conformance suite
// (broker/brokertest). The embedded NATS server of the demo is not part of
// it.
package nats

import (
	"context"
	"log/slog"
	"time"

	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/internal/logbridge"
)

// Config configures a Publisher and a Subscriber; each uses the fields its
// side documents. The zero value of every optional field means the default it
// documents. Errors name the fields as nats.Config.<Field>.
type Config struct {
	// URL is the NATS server, for example "nats://127.0.0.1:4222"; a
	// subscriber takes several, separated by commas. Required.
	URL string
	// Stream is the JetStream stream that stores the subjects. Default
	// DefaultStream ("PGRELAY").
	Stream string
	// SubjectPrefix prefixes every subject: an event of topic "orders" is
	// published to "<SubjectPrefix>.orders"; a subscriber strips it to
	// recover the topic of a message without a topic header. Default
	// DefaultSubjectPrefix ("pgrelay").
	SubjectPrefix string
	// CreateStream creates Stream (subjects "<SubjectPrefix>.>", file
	// storage) when it does not exist; an existing stream is never changed
	// (a publisher warns about the settings that differ). Default false: a
	// subscriber waits for the relay to create it.
	CreateStream bool
	// ReconnectWait is the pause between reconnection attempts; the client
	// reconnects forever once connected. Default 500ms for a publisher, 1s
	// for a subscriber.
	ReconnectWait time.Duration
	// Logger receives connection events. Default: none.
	Logger *slog.Logger

	// Publisher side.

	// DuplicateWindow is the stream's dedup window when a publisher creates
	// it. Default DefaultDuplicateWindow (2 minutes, JetStream's).
	DuplicateWindow time.Duration
	// StreamMaxAge is how long the stream keeps a message when a publisher
	// creates it; negative means no limit. Default DefaultStreamMaxAge (6
	// days).
	StreamMaxAge time.Duration
	// StreamReplicas is how many servers of a JetStream cluster keep the
	// stream when a publisher creates it: 3 survives the loss of one node.
	// Default 1 (the only value a single server accepts); 1 to 5.
	StreamReplicas int
	// AckTimeout bounds a publisher's wait for each acknowledgement. Default
	// 5s.
	AckTimeout time.Duration

	// Subscriber side.

	// Durable is the durable pull consumer's name: subscribers sharing it
	// share the work, so give each handler its own (for example
	// "pgrelay-consumer-billing"). When it does not exist it is created
	// delivering from now minus DedupWindow, never from the start of the
	// stream. Default DefaultDurable ("pgrelay-consumer").
	Durable string
	// FilterSubject selects which subjects of the stream to consume. Default
	// "<SubjectPrefix>.>" (everything the relay publishes).
	FilterSubject string
	// DedupWindow is how long the inbox keeps processed rows (the consumer's
	// DedupWindow): a redelivery is recognised as a duplicate only within
	// it. At attach the stream's MaxAge and duplicate window are checked
	// against it. Default DefaultDedupWindow (7 days).
	DedupWindow time.Duration
	// AllowReplayBeyondDedupWindow consumes a stream that keeps messages
	// longer than DedupWindow (or without an age limit), where a replay
	// could deliver events whose inbox rows retention already deleted.
	// Default false: such a stream is refused at attach with a
	// *ReplayWindowError.
	AllowReplayBeyondDedupWindow bool
	// AckWait is how long JetStream waits for an acknowledgement before it
	// redelivers a message. Default DefaultAckWait (30s); at least 1s.
	AckWait time.Duration
	// MaxAckPending caps the unacknowledged messages JetStream hands out to
	// the durable consumer; at least the consumer's FetchBatchSize, ten
	// times is a good value. Default 1000.
	MaxAckPending int
	// MaxPayloadBytes is the largest payload a subscriber accepts; a larger
	// message is delivered dead with its reason. Default 0: no limit.
	MaxPayloadBytes int

	// Wire format (publisher side; a subscriber reads both formats).

	// WireFormat is how a publisher lays events out: broker.WirePgrelay
	// (Pgrelay-* headers) or broker.WireCloudEvents (CloudEvents binary
	// mode, "ce-" headers, see broker.CloudEventsHeaders). Default
	// broker.WirePgrelay.
	WireFormat broker.WireFormat
	// CloudEventsSource is the source attribute of the CloudEvents a
	// publisher sends in broker.WireCloudEvents: a URI-reference. Default
	// broker.DefaultCloudEventsSource ("pgrelay").
	CloudEventsSource string
}

func (c Config) publisher() pubConfig {
	return pubConfig{URL: c.URL, SubjectPrefix: c.SubjectPrefix, Stream: c.Stream, CreateStream: c.CreateStream,
		DuplicateWindow: c.DuplicateWindow, StreamMaxAge: c.StreamMaxAge, StreamReplicas: c.StreamReplicas, AckTimeout: c.AckTimeout,
		ReconnectWait: c.ReconnectWait, Logger: logbridge.Or(c.Logger),
		WireFormat: c.WireFormat, CloudEventsSource: c.CloudEventsSource}
}

func (c Config) subscriber() subConfig {
	return subConfig{URL: c.URL, Stream: c.Stream, SubjectPrefix: c.SubjectPrefix, CreateStream: c.CreateStream,
		Durable: c.Durable, FilterSubject: c.FilterSubject, DedupWindow: c.DedupWindow,
		AllowReplayBeyondDedupWindow: c.AllowReplayBeyondDedupWindow, AckWait: c.AckWait,
		MaxAckPending: c.MaxAckPending, MaxPayloadBytes: c.MaxPayloadBytes, ReconnectWait: c.ReconnectWait,
		Logger: logbridge.Or(c.Logger)}
}

// ValidatePublisher checks the publisher's settings without connecting,
// naming each bad field.
func (c Config) ValidatePublisher() error { return c.publisher().WithDefaults().Validate() }

// ValidateSubscriber checks the subscriber's settings without connecting,
// naming each bad field.
func (c Config) ValidateSubscriber() error { return c.subscriber().WithDefaults().Validate() }

// NewPublisher connects to NATS and, when cfg.CreateStream is set, creates
// the stream if it does not exist. The connection reconnects on its own after
// a network failure. Close it when done.
func NewPublisher(ctx context.Context, cfg Config) (*Publisher, error) {
	return newPublisher(ctx, cfg.publisher())
}

// NewSubscriber validates cfg and connects. The first connection is not
// retried: a wrong or unreachable URL at start-up is a setting to fix,
// reported at once naming nats.Config.URL. Once connected, the client
// reconnects forever. Attaching to the durable consumer waits for the first
// Fetch, so that a stream the relay has not created yet is waited for.
func NewSubscriber(ctx context.Context, cfg Config) (*Subscriber, error) {
	return newSubscriber(ctx, cfg.subscriber())
}
