// Package rabbitmq is pgrelay's RabbitMQ adapter: a broker.Publisher that
// publishes with publisher confirms and mandatory routing, and a subscriber
// that consumes a durable queue with manual acknowledgements.
//
// Topology: one durable topic exchange (Config.Exchange); an event of topic
// "orders" is published with routing key "orders". One durable queue
// (Config.Queue), bound to the exchange with Config.BindingKey, holds the
// events for the consumer. The queue is a quorum queue (replicated, and the
// type RabbitMQ recommends for data safety) when the server supports them
// (RabbitMQ 3.8 and later), a classic durable queue otherwise; see
// Config.QueueType. Both sides declare the topology when they start (the
// declarations are idempotent), so the relay can publish before any consumer
// ever ran: a message that no queue would take is refused, not dropped.
package rabbitmq

import (
	"errors"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/internal/setting"
)

// Queue types for Config.QueueType.
const (
	// QueueTypeAuto declares a quorum queue when the server supports them
	// (RabbitMQ 3.8 or later), a classic durable queue otherwise.
	QueueTypeAuto = "auto"
	// QueueTypeQuorum always declares a quorum queue.
	QueueTypeQuorum = "quorum"
	// QueueTypeClassic always declares a classic durable queue.
	QueueTypeClassic = "classic"
)

// DefaultMaxMessageBytes is the default Config.MaxMessageBytes: 16 MiB,
// RabbitMQ 4's default max_message_size (3.x allowed 128 MiB).
const DefaultMaxMessageBytes = 16 << 20

// Config configures the RabbitMQ publisher and subscriber.
type Config struct {
	// URL is the AMQP 0-9-1 URL, for example
	// amqp://guest:guest@127.0.0.1:5672/ (amqps:// for TLS). Required.
	URL string
	// Exchange is the durable topic exchange events are published to, with
	// the event's topic as the routing key. Default: "pgrelay".
	Exchange string
	// Queue is the durable queue bound to Exchange that the consumer reads.
	// Default: "pgrelay".
	Queue string
	// BindingKey binds Queue to Exchange: "#" takes every topic, "orders"
	// one topic, "orders.*" a family. Default: "#".
	BindingKey string
	// QueueType is the type Queue is declared with when it does not exist:
	// QueueTypeAuto, QueueTypeQuorum or QueueTypeClassic. An existing queue
	// is used as it is. Default: QueueTypeAuto.
	QueueType string
	// SkipDeclare leaves the topology alone: the exchange, the queue and the
	// binding must exist already (the publisher then checks only the
	// exchange, the subscriber only the queue). Default: false (declare).
	SkipDeclare bool
	// Prefetch is the subscriber's basic.qos prefetch count: how many
	// unacknowledged deliveries the server sends ahead. It bounds a fetched
	// batch, and a delivery is acknowledged only once stored, so use at
	// least the consumer's batch size. Default: 256.
	Prefetch int
	// MaxInFlight bounds the publisher's messages awaiting a confirm, across
	// all keys. Default: 1024.
	MaxInFlight int
	// ConfirmTimeout bounds the wait for each publisher confirm. Default: 5s.
	ConfirmTimeout time.Duration
	// MaxMessageBytes is the largest message body published; a larger one
	// is refused as a permanent error without being sent. Keep it at or
	// below the server's max_message_size; a message the server refuses as
	// too large lowers the limit to the server's. Default:
	// DefaultMaxMessageBytes.
	MaxMessageBytes int
	// DialTimeout bounds each connection attempt. Default: 5s.
	DialTimeout time.Duration
	// Heartbeat is the AMQP heartbeat interval: a silent peer is declared
	// dead after about three of them. Default: 10s.
	Heartbeat time.Duration
	// ReconnectWait is the first pause between reconnection attempts; it
	// doubles after each failure up to ReconnectMaxWait. Default: 500ms.
	ReconnectWait time.Duration
	// ReconnectMaxWait caps the pause between reconnection attempts.
	// Default: 10s.
	ReconnectMaxWait time.Duration
	// MaxPayloadBytes is the largest payload the subscriber accepts; a
	// larger message is delivered dead with its reason. Default 0: no limit.
	MaxPayloadBytes int
	// Logger receives connection events. Default: none.
	Logger *slog.Logger
	// WireFormat is how the publisher lays messages out:
	// broker.WirePgrelay (Pgrelay-* headers) or broker.WireCloudEvents
	// (CloudEvents binary mode: "cloudEvents_" headers, datacontenttype as
	// the content-type property, see broker.CloudEventsHeaders). The
	// message-id property is the event id in both. Default
	// broker.WirePgrelay. Publisher only: the subscriber reads both.
	WireFormat broker.WireFormat
	// CloudEventsSource is the source attribute of the CloudEvents the
	// publisher sends in broker.WireCloudEvents: a URI-reference. Default
	// broker.DefaultCloudEventsSource ("pgrelay").
	CloudEventsSource string
	// CloudEventsPrefix is the prefix of the CloudEvents attribute headers
	// the publisher writes in broker.WireCloudEvents:
	// CloudEventsPrefixUnderscore ("cloudEvents_", the AMQP binding's
	// current prefix, which JMS clients can read) or CloudEventsPrefixColon
	// ("cloudEvents:", the one the CloudEvents Go SDK's AMQP binding,
	// protocol/amqp/v2, reads and writes). The subscriber reads both
	// whatever the setting. Default CloudEventsPrefixUnderscore.
	CloudEventsPrefix string
}

// The values of Config.CloudEventsPrefix.
const (
	CloudEventsPrefixUnderscore = "cloudEvents_"
	CloudEventsPrefixColon      = "cloudEvents:"
)

// WithDefaults returns the config with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Exchange == "" {
		c.Exchange = "pgrelay"
	}
	if c.Queue == "" {
		c.Queue = "pgrelay"
	}
	if c.BindingKey == "" {
		c.BindingKey = "#"
	}
	if c.QueueType == "" {
		c.QueueType = QueueTypeAuto
	}
	if c.Prefetch == 0 {
		c.Prefetch = 256
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = 1024
	}
	if c.ConfirmTimeout == 0 {
		c.ConfirmTimeout = 5 * time.Second
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = 5 * time.Second
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = 10 * time.Second
	}
	if c.ReconnectWait == 0 {
		c.ReconnectWait = 500 * time.Millisecond
	}
	if c.ReconnectMaxWait == 0 {
		c.ReconnectMaxWait = 10 * time.Second
	}
	if c.CloudEventsPrefix == "" {
		c.CloudEventsPrefix = CloudEventsPrefixUnderscore
	}
	return c
}

// Validate reports every invalid setting, each a *setting.FieldError naming
// "Config.<Field>".
func (c Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, setting.Errorf("", "rabbitmq.Config", field, format, args...))
	}
	if c.MaxPayloadBytes < 0 {
		bad("MaxPayloadBytes", "{} must not be negative, got %d", c.MaxPayloadBytes)
	}
	if c.URL == "" {
		bad("URL", "{} is required")
	} else if u, err := url.Parse(c.URL); err != nil || (u.Scheme != "amqp" && u.Scheme != "amqps") || u.Host == "" {
		bad("URL", "{} %q is not an amqp:// or amqps:// URL", RedactURL(c.URL))
	}
	name := func(field, v string) {
		switch {
		case len(v) > 255:
			bad(field, "{} is longer than 255 bytes")
		case strings.HasPrefix(v, "amq."):
			bad(field, "{} %q: names starting with \"amq.\" are reserved by RabbitMQ", v)
		case strings.ContainsAny(v, "\x00\r\n"):
			bad(field, "{} %q contains control characters", v)
		}
	}
	name("Exchange", c.Exchange)
	name("Queue", c.Queue)
	if len(c.BindingKey) > 255 {
		bad("BindingKey", "{} is longer than 255 bytes")
	}
	switch c.QueueType {
	case QueueTypeAuto, QueueTypeQuorum, QueueTypeClassic:
	default:
		bad("QueueType", "{} %q: want %q, %q or %q", c.QueueType, QueueTypeAuto, QueueTypeQuorum, QueueTypeClassic)
	}
	if c.Prefetch < 1 || c.Prefetch > 65535 {
		bad("Prefetch", "{} %d: want 1 to 65535", c.Prefetch)
	}
	if c.MaxInFlight < 1 {
		bad("MaxInFlight", "{} %d must be at least 1", c.MaxInFlight)
	}
	if c.MaxMessageBytes < 1 {
		bad("MaxMessageBytes", "{} %d must be at least 1", c.MaxMessageBytes)
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{{"ConfirmTimeout", c.ConfirmTimeout}, {"DialTimeout", c.DialTimeout}, {"Heartbeat", c.Heartbeat},
		{"ReconnectWait", c.ReconnectWait}, {"ReconnectMaxWait", c.ReconnectMaxWait}} {
		if d.v < 0 {
			bad(d.field, "{} %s must not be negative", d.v)
		}
	}
	if c.ReconnectMaxWait < c.ReconnectWait {
		bad("ReconnectMaxWait", "{} %s is shorter than {ReconnectWait} %s", c.ReconnectMaxWait, c.ReconnectWait)
	}
	if field, err := broker.CheckWire(c.WireFormat, c.CloudEventsSource); err != nil {
		bad(field, "{}: %v", err)
	}
	switch c.CloudEventsPrefix {
	case "", CloudEventsPrefixUnderscore, CloudEventsPrefixColon:
	default:
		bad("CloudEventsPrefix", "{} %q: want %q or %q", c.CloudEventsPrefix, CloudEventsPrefixUnderscore, CloudEventsPrefixColon)
	}
	return errors.Join(errs...)
}

// RedactURL hides the password of an AMQP URL, for logs and errors.
func RedactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}
