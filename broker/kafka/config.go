// Package kafka is pgrelay's Apache Kafka adapter, built on franz-go: a
// Publisher (an idempotent producer, acks from all in-sync replicas, the
// event's key as the record key) and a Subscriber (a consumer group whose
// offsets advance only over the contiguous prefix of records the caller
// acknowledged).
package kafka

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"regexp"
	"strings"
	"time"

	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/internal/setting"
)

// Config configures the Kafka publisher and subscriber. Fields that only one
// side reads say so.
type Config struct {
	// Brokers are the seed brokers, host:port each. Required
	// (--kafka-brokers, KAFKA_BROKERS).
	Brokers []string
	// TopicPrefix maps a pgrelay topic onto a Kafka topic: events of topic
	// "orders" go to "<TopicPrefix>.orders". Default: "pgrelay"
	// (--kafka-topic-prefix, KAFKA_TOPIC_PREFIX).
	TopicPrefix string
	// Group is the subscriber's consumer group. Default: "pgrelay-consumer"
	// (--kafka-group, KAFKA_GROUP). Subscriber only.
	Group string
	// Topics are the pgrelay topics the subscriber consumes. Empty means
	// every Kafka topic named "<TopicPrefix>.*", found again every
	// MetadataMaxAge. Subscriber only.
	Topics []string
	// MaxPayloadBytes is the largest payload the subscriber accepts; a
	// larger record is delivered dead (stored with the reason). Zero means
	// no limit. Subscriber only.
	MaxPayloadBytes int
	// DedupWindow is the inbox's dedup window. When set, the subscriber
	// refuses to start on a topic that keeps records longer (retention.ms),
	// unless AllowReplayBeyondDedupWindow. Subscriber only.
	DedupWindow time.Duration
	// AllowReplayBeyondDedupWindow lets the subscriber run on topics that
	// keep records longer than DedupWindow, where a group starting over
	// could apply an old event twice (--kafka-allow-replay-beyond-dedup-window).
	// Subscriber only.
	AllowReplayBeyondDedupWindow bool
	// ClientID names the client to the brokers. Default: "pgrelay".
	ClientID string
	// MaxInFlight bounds the records a publisher has unacknowledged, across
	// all keys and Publish calls (one per key at a time): a Publish waits for
	// room beyond it (--kafka-max-in-flight). Default: 10000.
	MaxInFlight int
	// MaxMessageBytes is the largest record the publisher sends (key, value
	// and headers); a larger one fails permanently without being sent. Keep
	// it at or below the topics' max.message.bytes. Default: 1000000.
	MaxMessageBytes int
	// UnknownTopicRetries is how many times a record may meet "unknown topic"
	// (the publisher never creates topics) before it fails permanently, each
	// after a metadata refresh. Default: 4.
	UnknownTopicRetries int
	// DeliveryTimeout bounds how long the publisher keeps retrying a record
	// (broker down, leader moving) before it fails transiently; the relay
	// then retries it in order. Default: 30s.
	DeliveryTimeout time.Duration
	// ProducerRetries bounds how often the producer resends a record after a
	// failed request (a cut connection, a leader move) before failing it;
	// the relay then retries it, in order. 0: as often as DeliveryTimeout
	// allows; -1: never (every failed request fails its records).
	ProducerRetries int
	// DialTimeout bounds each connection attempt. Default: 10s.
	DialTimeout time.Duration
	// SessionTimeout is the consumer group session timeout: a member that
	// stops heartbeating loses its partitions after it. Default: 45s.
	SessionTimeout time.Duration
	// CommitInterval is the longest an acknowledged record's offset waits
	// before it is committed; acknowledgements that arrive together are
	// committed together. Default: 200ms. Subscriber only.
	CommitInterval time.Duration
	// MetadataMaxAge is how often metadata is refreshed (and, without
	// Topics, new "<TopicPrefix>.*" topics found). Default: 10s.
	MetadataMaxAge time.Duration
	// Dial, when set, opens the client's connections (tests route them
	// through a fault-injecting proxy). Default: a net.Dialer.
	Dial func(ctx context.Context, network, address string) (net.Conn, error)
	// Logger receives connection and group events. Default: none.
	Logger *slog.Logger
	// WireFormat is how the publisher lays records out:
	// broker.WirePgrelay (Pgrelay-* headers) or broker.WireCloudEvents
	// (CloudEvents binary mode, "ce_" headers, datacontenttype as the
	// content-type header, see broker.CloudEventsHeaders). The record key is
	// the event key in both. Default broker.WirePgrelay. Publisher only: the
	// subscriber reads both.
	WireFormat broker.WireFormat
	// CloudEventsSource is the source attribute of the CloudEvents the
	// publisher sends in broker.WireCloudEvents: a URI-reference. Default
	// broker.DefaultCloudEventsSource ("pgrelay").
	CloudEventsSource string
}

// WithDefaults returns the config with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.TopicPrefix == "" {
		c.TopicPrefix = "pgrelay"
	}
	if c.Group == "" {
		c.Group = "pgrelay-consumer"
	}
	if c.ClientID == "" {
		c.ClientID = "pgrelay"
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = 10000
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = 1000000
	}
	if c.UnknownTopicRetries == 0 {
		c.UnknownTopicRetries = 4
	}
	if c.DeliveryTimeout == 0 {
		c.DeliveryTimeout = 30 * time.Second
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = 10 * time.Second
	}
	if c.SessionTimeout == 0 {
		c.SessionTimeout = 45 * time.Second
	}
	if c.CommitInterval == 0 {
		c.CommitInterval = 200 * time.Millisecond
	}
	if c.MetadataMaxAge == 0 {
		c.MetadataMaxAge = 10 * time.Second
	}
	return c
}

// legalTopic is Kafka's rule for topic names.
var legalTopic = regexp.MustCompile(`^[a-zA-Z0-9._-]+$`)

// maxTopicLen is Kafka's longest topic name.
const maxTopicLen = 249

// Validate reports every invalid setting, each naming its field as
// kafka.Config.<Field> (a *setting.FieldError).
func (c Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, setting.Errorf("", "kafka.Config", field, format, args...))
	}
	if len(c.Brokers) == 0 {
		bad("Brokers", "{} is required")
	}
	for _, b := range c.Brokers {
		if _, port, err := net.SplitHostPort(b); err != nil || port == "" {
			bad("Brokers", "{}: %q is not host:port", b)
		}
	}
	if !legalTopic.MatchString(c.TopicPrefix) || len(c.TopicPrefix) > maxTopicLen-2 {
		bad("TopicPrefix", "{} %q: want letters, digits, '.', '_' or '-', at most %d characters", c.TopicPrefix, maxTopicLen-2)
	}
	if strings.TrimSpace(c.Group) == "" || c.Group != strings.TrimSpace(c.Group) {
		bad("Group", "{} %q: want a name without surrounding spaces", c.Group)
	}
	for _, t := range c.Topics {
		if !legalTopic.MatchString(c.TopicPrefix+"."+t) || len(c.TopicPrefix)+1+len(t) > maxTopicLen {
			bad("Topics", "{}: topic %q does not make a legal Kafka topic name with prefix %q", t, c.TopicPrefix)
		}
	}
	switch {
	case c.MaxInFlight < 1:
		bad("MaxInFlight", "{} must be at least 1, got %d", c.MaxInFlight)
	case c.MaxMessageBytes < 1024 || c.MaxMessageBytes > 1<<30:
		bad("MaxMessageBytes", "{} must be between 1024 and %d, got %d", 1<<30, c.MaxMessageBytes)
	case c.UnknownTopicRetries < 1:
		bad("UnknownTopicRetries", "{} must be at least 1, got %d", c.UnknownTopicRetries)
	case c.ProducerRetries < -1:
		bad("ProducerRetries", "{} must be -1 or more, got %d", c.ProducerRetries)
	case c.DeliveryTimeout > 0 && c.DeliveryTimeout < time.Second:
		bad("DeliveryTimeout", "{} must be at least 1s, got %s", c.DeliveryTimeout)
	case c.DeliveryTimeout < 0:
		bad("DeliveryTimeout", "{} must not be negative, got %s", c.DeliveryTimeout)
	case c.DialTimeout < 0:
		bad("DialTimeout", "{} must not be negative, got %s", c.DialTimeout)
	case c.CommitInterval < 0:
		bad("CommitInterval", "{} must not be negative, got %s", c.CommitInterval)
	case c.MetadataMaxAge < 0:
		bad("MetadataMaxAge", "{} must not be negative, got %s", c.MetadataMaxAge)
	case c.MaxPayloadBytes < 0:
		bad("MaxPayloadBytes", "{} must not be negative, got %d", c.MaxPayloadBytes)
	case c.SessionTimeout < time.Second:
		bad("SessionTimeout", "{} must be at least 1s, got %s", c.SessionTimeout)
	}
	if field, err := broker.CheckWire(c.WireFormat, c.CloudEventsSource); err != nil {
		bad(field, "{}: %v", err)
	}
	return errors.Join(errs...)
}

// KafkaTopic returns the Kafka topic an event of the pgrelay topic goes to.
func (c Config) KafkaTopic(topic string) string { return c.TopicPrefix + "." + topic }
