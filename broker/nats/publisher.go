package nats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/internal/rounds"
	"github.com/pgrelay/pgrelay/internal/setting"
)

// pubConfig configures a NATS JetStream publisher.
type pubConfig struct {
	// URL is the NATS server URL (for example nats://127.0.0.1:4222).
	// Required.
	URL string
	// SubjectPrefix prefixes every subject: an event of topic "orders" is
	// published to "<SubjectPrefix>.orders". Default: DefaultSubjectPrefix.
	SubjectPrefix string
	// Stream is the JetStream stream that stores the subjects; it is created
	// when CreateStream is set. Default: DefaultStream.
	Stream string
	// CreateStream creates the stream (subjects "<SubjectPrefix>.>", file
	// storage, StreamMaxAge, DuplicateWindow) when it does not exist; an
	// existing stream is left as it is, with a warning naming the settings
	// that differ. Default: false.
	CreateStream bool
	// DuplicateWindow is the stream's dedup window when it is created.
	// Default: 2 minutes (JetStream's default).
	DuplicateWindow time.Duration
	// StreamMaxAge is how long the stream keeps a message when it is
	// created; negative means no limit. An existing stream is never changed.
	// Default: DefaultStreamMaxAge (6 days).
	StreamMaxAge time.Duration
	// StreamReplicas is the stream's replica count when it is created (on
	// a JetStream cluster, 3 survives a node loss). Default: 1; 1 to 5.
	StreamReplicas int
	// AckTimeout bounds the wait for each acknowledgement. Default: 5s.
	AckTimeout time.Duration
	// ReconnectWait is the pause between reconnection attempts; the client
	// reconnects forever. Default: 500ms.
	ReconnectWait time.Duration
	// Logger receives connection events. Default: a no-op logger.
	Logger *slog.Logger
	// WireFormat and CloudEventsSource: see Config.
	WireFormat        broker.WireFormat
	CloudEventsSource string
}

// WithDefaults returns the config with every zero field set to its default.
func (c pubConfig) WithDefaults() pubConfig {
	if c.SubjectPrefix == "" {
		c.SubjectPrefix = DefaultSubjectPrefix
	}
	if c.Stream == "" {
		c.Stream = DefaultStream
	}
	if c.DuplicateWindow == 0 {
		c.DuplicateWindow = DefaultDuplicateWindow
	}
	if c.AckTimeout == 0 {
		c.AckTimeout = 5 * time.Second
	}
	if c.ReconnectWait == 0 {
		c.ReconnectWait = 500 * time.Millisecond
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate checks the settings (after WithDefaults), naming a bad field as
// pubConfig.<Field> (a *setting.FieldError).
func (c pubConfig) Validate() error {
	bad := func(field, format string, args ...any) error {
		return setting.Errorf("", "nats.Config", field, format, args...)
	}
	switch {
	case c.URL == "":
		return bad("URL", "{} is required")
	case strings.ContainsAny(c.SubjectPrefix, " \t\r\n*>") || strings.HasPrefix(c.SubjectPrefix, ".") || strings.HasSuffix(c.SubjectPrefix, "."):
		return bad("SubjectPrefix", "{} %q is not a valid subject prefix", c.SubjectPrefix)
	case strings.ContainsAny(c.Stream, " \t\r\n.*>/\\"):
		return bad("Stream", "{} %q is not a valid stream name", c.Stream)
	case c.AckTimeout < 0:
		return bad("AckTimeout", "{} must not be negative")
	case c.DuplicateWindow < 0:
		return bad("DuplicateWindow", "{} must not be negative")
	case c.StreamReplicas < 0 || c.StreamReplicas > 5:
		return bad("StreamReplicas", "{} must be 1 to 5 (0: 1), got %d", c.StreamReplicas)
	}
	if field, err := broker.CheckWire(c.WireFormat, c.CloudEventsSource); err != nil {
		return bad(field, "{}: %v", err)
	}
	return nil
}

// maxPendingAcks bounds the publishes awaiting an acknowledgement on one
// client: 16 partitions at the largest batch size fit.
const maxPendingAcks = 1 << 18

// Publisher publishes to NATS JetStream. Each message goes to
// "<SubjectPrefix>.<topic>" with the event id as JetStream's dedup id
// (Nats-Msg-Id), the event's metadata in Pgrelay-* headers and the payload
// as the body (broker.EncodeHeaders: pgrelay's logical header names are the NATS
// header names).
type Publisher struct {
	cfg pubConfig
	nc  *nats.Conn
	js  jetstream.JetStream
	log *slog.Logger
}

// newPublisher connects to NATS and, when cfg.CreateStream is set, creates the
// stream if it does not exist (an existing stream is never changed). The
// connection reconnects on its own after a network failure.
func newPublisher(ctx context.Context, cfg pubConfig) (*Publisher, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger.With(slog.String("logger", "nats"))
	nc, err := nats.Connect(cfg.URL,
		nats.Name("pgrelay-relay"),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(cfg.ReconnectWait),
		nats.RetryOnFailedConnect(false),
		// No reconnect buffer: a publish made while the connection is down
		// fails at once instead of leaving later, after a reconnect. Otherwise
		// a message lost with the old connection could be overtaken by a later
		// message of the same key sent from the buffer, breaking per-key order.
		nats.ReconnectBufSize(-1),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			log.Warn("disconnected from NATS", slog.Any("error", err))
		}),
		nats.ReconnectHandler(func(c *nats.Conn) {
			log.Info("reconnected to NATS", slog.String("url", c.ConnectedUrlRedacted()))
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("broker: connect to NATS (%s): %w", cfg.URL, err)
	}
	// Every partition worker of a relay publishes through this one client,
	// so allow far more messages in flight than the default 4,000.
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(cfg.AckTimeout), jetstream.WithPublishAsyncMaxPending(maxPendingAcks))
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("broker: jetstream: %w", err)
	}
	p := &Publisher{cfg: cfg, nc: nc, js: js, log: log}
	if cfg.CreateStream {
		if err := p.ensureStream(ctx); err != nil {
			nc.Close()
			return nil, err
		}
	}
	return p, nil
}

func (p *Publisher) ensureStream(ctx context.Context) error {
	_, err := ensureStream(ctx, p.js, StreamSpec{Name: p.cfg.Stream, SubjectPrefix: p.cfg.SubjectPrefix,
		MaxAge: p.cfg.StreamMaxAge, DuplicateWindow: p.cfg.DuplicateWindow, Replicas: p.cfg.StreamReplicas}, p.log)
	if err != nil {
		return fmt.Errorf("broker: %w", err)
	}
	return nil
}

// Subject returns the subject an event of topic is published to.
func (p *Publisher) Subject(topic string) string { return p.cfg.SubjectPrefix + "." + topic }

// Conn returns the underlying NATS connection.
func (p *Publisher) Conn() *nats.Conn { return p.nc }

// Publish implements Publisher. Messages of different keys are in flight at
// the same time; the messages of one key are sent one after another, each once
// the previous one is acknowledged, and a key's remaining messages are not sent
// after a transient failure. So a later event of a key is never stored while an
// earlier one failed: the relay retries from the failed one, in order.
//
// It runs on the caller's goroutine, in rounds (internal/rounds): each round
// sends every key's next message asynchronously, then awaits their
// acknowledgements.
func (p *Publisher) Publish(ctx context.Context, msgs []pgrelay.Message) []broker.Result {
	return rounds.Publish(msgs, func(i int, _ bool) rounds.Await {
		nm, err := p.wireMessage(msgs[i])
		if err != nil {
			return rounds.Err(err) // permanent: dead-lettered
		}
		f, err := p.js.PublishMsgAsync(nm, jetstream.WithMsgID(msgs[i].EventID))
		return func() broker.Result {
			if err == nil {
				select {
				case ack := <-f.Ok():
					return broker.Result{Duplicate: ack.Duplicate}
				case err = <-f.Err():
				case <-ctx.Done():
					err = fmt.Errorf("waiting for the acknowledgement: %w", ctx.Err())
				}
			}
			return broker.Result{Err: p.classify(ctx, nm, err)}
		}
	})
}

func (p *Publisher) toNATS(m pgrelay.Message) *nats.Msg {
	enc := broker.EncodeHeaders(m)
	h := make(nats.Header, len(enc))
	// One backing array for every header's single value.
	vals := make([]string, 0, len(enc))
	for k, v := range enc {
		vals = append(vals, v)
		h[k] = vals[len(vals)-1 : len(vals) : len(vals)]
	}
	return &nats.Msg{Subject: p.Subject(m.Topic), Header: h, Data: m.Payload}
}

// jsErrCodeHeaderExceedsMaximum is JetStream's error for headers over 64 KiB
// (JSStreamHeaderExceedsMaximumErr); nats.go has no constant for it.
const jsErrCodeHeaderExceedsMaximum jetstream.ErrorCode = 10097

// classify turns a publish error into a permanent one when no retry can fix
// it; everything else (timeouts, disconnections) stays transient.
func (p *Publisher) classify(ctx context.Context, nm *nats.Msg, err error) error {
	subject := nm.Subject
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, nats.ErrMaxPayload):
		return broker.Terminalf("message too large for the NATS server: payload of %d bytes plus headers, the server's max_payload is %d bytes: %w",
			len(nm.Data), p.nc.MaxPayload(), err)
	case errors.Is(err, nats.ErrBadSubject), errors.Is(err, jetstream.ErrInvalidSubject):
		return broker.Terminalf("invalid subject %q: %w", subject, err)
	case errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum:
		return broker.Terminalf("message too large for the stream: payload of %d bytes plus headers, %s: %w", len(nm.Data), p.streamMaxMsgSize(ctx), err)
	case errors.As(err, &apiErr) && apiErr.ErrorCode == jsErrCodeHeaderExceedsMaximum:
		return broker.Terminalf("message headers (key, event type and headers) too large for the stream: %w", err)
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrNoResponders):
		// No responders: either no stream stores the subject (permanent) or
		// the server is restarting (transient). Ask JetStream which.
		lctx, cancel := context.WithTimeout(ctx, p.cfg.AckTimeout)
		defer cancel()
		if _, lerr := p.js.StreamNameBySubject(lctx, subject); errors.Is(lerr, jetstream.ErrStreamNotFound) {
			return broker.Terminalf("no stream stores subject %q", subject)
		}
	}
	return err
}

// streamMaxMsgSize names the configured stream's max_msg_size for a
// dead reason ("the stream's max_msg_size is N bytes"), or says it could
// not be read.
func (p *Publisher) streamMaxMsgSize(ctx context.Context) string {
	lctx, cancel := context.WithTimeout(ctx, p.cfg.AckTimeout)
	defer cancel()
	s, err := p.js.Stream(lctx, p.cfg.Stream)
	if err != nil {
		return fmt.Sprintf("the stream's max_msg_size could not be read (%v)", err)
	}
	return fmt.Sprintf("the stream's max_msg_size is %d bytes", s.CachedInfo().Config.MaxMsgSize)
}

// Close drains nothing: callers wait for their acknowledgements in Publish.
// It closes the connection.
func (p *Publisher) Close() error {
	p.nc.Close()
	return nil
}
