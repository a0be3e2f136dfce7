package nats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/internal/setting"
)

// subConfig configures a NATS JetStream subscriber: a durable pull
// consumer on a stream.
type subConfig struct {
	// URL is the NATS server to consume from, for example
	// "nats://127.0.0.1:4222". Several URLs may be separated by commas.
	// Required.
	URL string
	// Stream is the JetStream stream to consume. Default DefaultStream.
	Stream string
	// SubjectPrefix is the prefix the relay puts before each topic; it is
	// stripped to recover the topic of a message that carries no topic
	// header. Default DefaultSubjectPrefix.
	SubjectPrefix string
	// CreateStream creates Stream (StreamSpec: subjects "<SubjectPrefix>.>",
	// file storage, a MaxAge within DedupWindow) when it does not exist yet,
	// instead of waiting for the relay to create it. Default false.
	CreateStream bool
	// Durable is the durable pull consumer's name: subscribers sharing it
	// share the work. Default DefaultDurable. When it does not exist it is
	// created delivering from now minus DedupWindow, never from the start of
	// the stream: older messages could be events whose inbox rows retention
	// already deleted.
	Durable string
	// FilterSubject selects which subjects of the stream to consume. Default
	// "<SubjectPrefix>.>" (everything the relay publishes).
	FilterSubject string
	// DedupWindow is how long the inbox keeps processed rows: a redelivery is
	// recognised as a duplicate only within it. At attach the stream's MaxAge
	// and duplicate window are checked against it. Default
	// DefaultDedupWindow (7 days).
	DedupWindow time.Duration
	// AllowReplayBeyondDedupWindow consumes a stream that keeps messages
	// longer than DedupWindow (or without an age limit), where a replay could
	// deliver events whose inbox rows retention already deleted. Default
	// false: such a stream is refused at attach with a *ReplayWindowError.
	AllowReplayBeyondDedupWindow bool
	// AckWait is how long JetStream waits for an acknowledgement before it
	// redelivers a message. Default 30s; at least 1s.
	AckWait time.Duration
	// MaxAckPending caps the unacknowledged messages JetStream hands out to
	// the durable consumer. Default 1000.
	MaxAckPending int
	// MaxPayloadBytes is the largest accepted payload; a larger message is
	// delivered dead with its reason. Zero means no limit.
	MaxPayloadBytes int
	// ReconnectWait is the pause between reconnection attempts; the client
	// reconnects forever once connected. Default 1s.
	ReconnectWait time.Duration
	// Logger receives connection and attach events. Default: a no-op logger.
	Logger *slog.Logger
}

// Defaults for subConfig.
const (
	DefaultDurable = "pgrelay-consumer"
	// DefaultDedupWindow is the inbox's default dedup window: inbox
	// retention's default window.
	DefaultDedupWindow = pgrelay.DefaultDedupWindow
	DefaultAckWait     = 30 * time.Second
)

// WithDefaults returns the config with every zero field set to its default.
func (c subConfig) WithDefaults() subConfig {
	if c.Stream == "" {
		c.Stream = DefaultStream
	}
	if c.SubjectPrefix == "" {
		c.SubjectPrefix = DefaultSubjectPrefix
	}
	if c.Durable == "" {
		c.Durable = DefaultDurable
	}
	if c.FilterSubject == "" {
		c.FilterSubject = c.SubjectPrefix + ".>"
	}
	if c.DedupWindow == 0 {
		c.DedupWindow = DefaultDedupWindow
	}
	if c.AckWait == 0 {
		c.AckWait = DefaultAckWait
	}
	if c.MaxAckPending == 0 {
		c.MaxAckPending = 1000
	}
	if c.ReconnectWait == 0 {
		c.ReconnectWait = time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate checks the settings (after WithDefaults), naming each bad field
// as subConfig.<Field> (a *setting.FieldError).
func (c subConfig) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, setting.Errorf("", "nats.Config", field, format, args...))
	}
	if strings.TrimSpace(c.URL) == "" {
		bad("URL", "{} is required")
	}
	if strings.ContainsAny(c.Stream, " \t\r\n.*>/\\") {
		bad("Stream", "{} %q must not contain spaces, '.', '*', '>' or slashes", c.Stream)
	}
	if strings.ContainsAny(c.Durable, " \t\r\n.*>/\\") {
		bad("Durable", "{} %q must not contain spaces, '.', '*', '>' or slashes", c.Durable)
	}
	if strings.ContainsAny(c.SubjectPrefix, " \t\r\n*>") || strings.HasPrefix(c.SubjectPrefix, ".") || strings.HasSuffix(c.SubjectPrefix, ".") {
		bad("SubjectPrefix", "{} %q is not a subject prefix", c.SubjectPrefix)
	}
	if c.DedupWindow < 0 {
		bad("DedupWindow", "{} %s must be positive", c.DedupWindow)
	}
	if c.AckWait < time.Second {
		bad("AckWait", "{} %s must be at least 1s", c.AckWait)
	}
	if c.MaxAckPending < 1 {
		bad("MaxAckPending", "{} %d must be positive", c.MaxAckPending)
	}
	if c.MaxPayloadBytes < 0 {
		bad("MaxPayloadBytes", "{} %d must not be negative", c.MaxPayloadBytes)
	}
	return errors.Join(errs...)
}

// Subscriber is the NATS JetStream broker.Subscriber: a durable pull consumer,
// attached (and the stream checked) on the first Fetch and again whenever the
// durable or its stream disappears.
type Subscriber struct {
	cfg subConfig
	log *slog.Logger
	nc  *nats.Conn
	js  jetstream.JetStream

	// mu serialises Fetch; cons and streamCreated belong to it.
	mu   sync.Mutex
	cons jetstream.Consumer
	// streamCreated is the attached stream's creation time, part of the
	// stand-in id of a message without an event id.
	streamCreated time.Time
	// checked is when the durable was last known to exist (see Fetch).
	checked time.Time
	// pulls is the persistent pull on cons that Fetch takes messages from;
	// nil until the first Fetch after an attach.
	pulls *pullStream
	// wait times Fetch's wait for a first message (reused).
	wait *time.Timer
}

// durableCheckInterval is how often an idle subscriber checks that its
// durable still exists: a pull request on a deleted durable is not answered,
// so an idle fetch cannot tell a deleted durable from an empty stream.
const durableCheckInterval = 5 * time.Second

// newSubscriber validates cfg (after WithDefaults) and connects. The
// first connection is not retried: a wrong or unreachable URL at start-up is
// a setting to fix, reported at once with its cause. Once connected, the
// client reconnects forever. Attaching to the durable consumer waits for the
// first Fetch, so that a stream the relay has not created yet is waited for.
func newSubscriber(ctx context.Context, cfg subConfig) (*Subscriber, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("broker: %w", err)
	}
	s := &Subscriber{cfg: cfg, log: cfg.Logger.With(slog.String("logger", "nats"))}
	timeout := nats.DefaultTimeout
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < timeout {
		timeout = max(time.Until(dl), time.Millisecond)
	}
	dialer := &recordingDialer{Dialer: net.Dialer{Timeout: timeout}}
	nc, err := nats.Connect(cfg.URL,
		nats.Name("pgrelay-consumer"),
		nats.SetCustomDialer(dialer),
		nats.RetryOnFailedConnect(false),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(cfg.ReconnectWait),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			s.log.Warn("disconnected from NATS", slog.Any("error", err))
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			s.log.Info("reconnected to NATS", slog.String("url", nc.ConnectedUrlRedacted()))
		}),
	)
	if err != nil {
		if cause := dialer.lastError(); cause != nil {
			err = fmt.Errorf("%w (%v)", err, cause)
		}
		return nil, setting.Errorf("", "nats.Config", "URL", "cannot connect to NATS at {} %s: %w", RedactURLs(cfg.URL), err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("broker: jetstream: %w", err)
	}
	s.nc, s.js = nc, js
	return s, nil
}

// Conn returns the underlying NATS connection.
func (s *Subscriber) Conn() *nats.Conn { return s.nc }

// Retention reads the stream's MaxAge and duplicate window
// (broker.RetentionReporter).
func (s *Subscriber) Retention(ctx context.Context) (broker.Retention, error) {
	st, err := s.js.Stream(ctx, s.cfg.Stream)
	if err != nil {
		return broker.Retention{}, fmt.Errorf("nats: stream %q: %w", s.cfg.Stream, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return broker.Retention{}, fmt.Errorf("nats: stream %q: %w", s.cfg.Stream, err)
	}
	return broker.Retention{Kind: "NATS JetStream stream", Name: info.Config.Name, MaxAge: info.Config.MaxAge,
		DuplicateWindow: info.Config.Duplicates}, nil
}

// Close hands back the messages received and not yet fetched (redelivered at
// once), flushes the acknowledgements sent so far and closes the connection.
// Fetched messages not acknowledged are redelivered after AckWait.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	s.stopPulls()
	s.mu.Unlock()
	_ = s.nc.FlushTimeout(2 * time.Second)
	s.nc.Close()
	return nil
}

// Fetch implements broker.Subscriber. It attaches first when it is not attached
// (creating the stream with CreateStream, checking the replay window,
// creating or updating the durable). A stream that outlives the dedup window
// is refused with a permanent *ReplayWindowError (broker.IsTerminal): a setting to
// fix, not an outage to wait out.
//
// Messages come from one persistent pull subscription on the durable (see
// pullStream), not from a pull request per batch. Fetch waits up to maxWait
// for the first message, then takes whatever else has arrived, up to max, so
// a lone message is returned at once instead of waiting for a full batch. A
// stop (ctx done) ends the wait at once: what has arrived stays for the next
// Fetch, and Close hands it back to the server.
func (s *Subscriber) Fetch(ctx context.Context, max int, maxWait time.Duration) ([]broker.Delivery, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cons == nil {
		if err := s.attach(ctx); err != nil {
			return nil, err
		}
	}
	msgs, err := s.fetch(ctx, max, maxWait)
	switch {
	case len(msgs) > 0:
		s.checked = time.Now()
	case err == nil && time.Since(s.checked) >= durableCheckInterval:
		err = s.checkDurable(ctx)
	case errors.Is(err, nats.ErrNoResponders), errors.Is(err, jetstream.ErrNoHeartbeat):
		// Servers before 2.10 answer a pull on a deleted durable with "no
		// responders" instead of leaving it unanswered; later ones stop
		// sending heartbeats. Ask whether the durable is gone; otherwise
		// "no responders" stays a transient error, and the client has
		// already sent a new pull request after missed heartbeats.
		cerr := s.checkDurable(ctx)
		if cerr != nil || errors.Is(err, jetstream.ErrNoHeartbeat) {
			err = cerr
		}
	}
	if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrConsumerDeleted) ||
		errors.Is(err, jetstream.ErrStreamNotFound) {
		// The durable (or its stream) is gone, for example deleted by an
		// operator or lost with a memory-backed server: attach again at the
		// next Fetch rather than fetch from nothing forever.
		s.stopPulls()
		s.cons = nil
	}
	return s.deliveries(msgs), err
}

// checkDurable asks JetStream whether the durable still exists. Only its
// absence is an error; any other failure shows in the next fetch.
func (s *Subscriber) checkDurable(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := s.cons.Info(ctx)
	switch {
	case err == nil:
		s.checked = time.Now()
		return nil
	case errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, jetstream.ErrStreamNotFound):
		return fmt.Errorf("durable consumer %q on stream %q is gone: %w", s.cfg.Durable, s.cfg.Stream, err)
	default:
		return nil
	}
}

// pullStream is a persistent pull subscription on the durable
// (jetstream.Consumer.Consume): the client keeps pull requests for half a
// batch open on the server and asks again when half of those arrived, so a
// batch costs neither a subscription nor a pull request of its own. What
// arrived waits in msgs, room for a batch, until Fetch takes it; the client
// counts a message as arrived only once msgs took it, so a subscriber holds
// at most one and a half batches it has not handed out. What it holds when
// the stream stops is handed back to the server (Nak), redelivered at once
// rather than after AckWait.
type pullStream struct {
	cc   jetstream.ConsumeContext
	msgs chan jetstream.Msg
	// errs carries the errors the client reports while pulling.
	errs chan error
	// stop ends the hand-over: what arrives after it is kept in held.
	stop chan struct{}
	mu   sync.Mutex
	held []jetstream.Msg
}

// pullStreamExpiry is how long one of the stream's pull requests lasts on the
// server before the client renews it; heartbeats come every half of it.
const pullStreamExpiry = 30 * time.Second

// startPulls starts the persistent pull on s.cons for batches of size
// messages (at most MaxAckPending): half a batch requested from the server,
// a batch waiting for Fetch.
func (s *Subscriber) startPulls(size int) (*pullStream, error) {
	size = min(size, s.cfg.MaxAckPending)
	half := (size + 1) / 2
	p := &pullStream{msgs: make(chan jetstream.Msg, size), errs: make(chan error, 8), stop: make(chan struct{})}
	cc, err := s.cons.Consume(func(m jetstream.Msg) {
		select {
		case p.msgs <- m:
		case <-p.stop:
			p.mu.Lock()
			p.held = append(p.held, m)
			p.mu.Unlock()
		}
	},
		jetstream.PullMaxMessages(half),
		jetstream.PullExpiry(pullStreamExpiry),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			select {
			case p.errs <- err:
			default: // Fetch has not read the earlier ones yet: one is enough
			}
		}))
	if err != nil {
		return nil, err
	}
	p.cc = cc
	return p, nil
}

// stopPulls stops the persistent pull, if any, and hands back to the server
// the messages that arrived and were not fetched (Nak: redelivered at once).
func (s *Subscriber) stopPulls() {
	p := s.pulls
	if p == nil {
		return
	}
	s.pulls = nil
	close(p.stop)
	// Draining, not stopping: the messages already on their way are handed
	// back too. They are handed back once the subscription is gone, when
	// the server no longer redelivers them to it.
	p.cc.Drain()
	select {
	case <-p.cc.Closed():
	case <-time.After(2 * time.Second):
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range p.held {
		_ = m.Nak()
	}
	for {
		select {
		case m := <-p.msgs:
			_ = m.Nak()
		default:
			return
		}
	}
}

// fetch waits up to maxWait for a first message of the persistent pull, then
// takes whatever else has arrived, up to max.
func (s *Subscriber) fetch(ctx context.Context, max int, maxWait time.Duration) ([]jetstream.Msg, error) {
	if max < 1 {
		max = 1
	}
	if s.pulls == nil {
		p, err := s.startPulls(max)
		if err != nil {
			return nil, err
		}
		s.pulls = p
	}
	p := s.pulls
	var first jetstream.Msg
	select {
	case first = <-p.msgs:
	default:
		if s.wait == nil {
			s.wait = time.NewTimer(maxWait)
		} else {
			s.wait.Reset(maxWait)
		}
		select {
		case first = <-p.msgs:
		case err := <-p.errs:
			s.wait.Stop()
			return nil, s.pullError(err)
		case <-s.wait.C:
			return nil, nil
		case <-ctx.Done():
			s.wait.Stop()
			return nil, nil
		}
		s.wait.Stop()
	}
	msgs := make([]jetstream.Msg, 0, min(max, len(p.msgs)+1))
	msgs = append(msgs, first)
	for len(msgs) < max {
		select {
		case m := <-p.msgs:
			msgs = append(msgs, m)
		default:
			return msgs, nil
		}
	}
	return msgs, nil
}

// pullError sorts an error the client reported while pulling. Missed
// heartbeats are returned for Fetch to ask whether the durable still exists
// (the client has already asked again); the ones the client recovers from by
// itself (a leadership change, a server shutting down, which a reconnect
// follows) are dropped; any other error stops the persistent pull, which the
// next Fetch starts again.
func (s *Subscriber) pullError(err error) error {
	switch {
	case errors.Is(err, jetstream.ErrNoHeartbeat):
		return err
	case errors.Is(err, jetstream.ErrConsumerLeadershipChanged), errors.Is(err, jetstream.ErrServerShutdown),
		errors.Is(err, jetstream.ErrPinIDMismatch):
		return nil
	default:
		s.stopPulls()
		return err
	}
}

// deliveries decodes fetched messages. A message broker.Decode cannot identify
// stably is left unacknowledged and logged.
func (s *Subscriber) deliveries(msgs []jetstream.Msg) []broker.Delivery {
	if len(msgs) == 0 {
		return nil
	}
	out := make([]broker.Delivery, 0, len(msgs))
	for _, m := range msgs {
		nm := natsMessage{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()}
		first := false
		if meta, err := m.Metadata(); err == nil {
			first = meta.NumDelivered == 1
			nm.Stream, nm.StreamSeq, nm.Timestamp = meta.Stream, meta.Sequence.Stream, meta.Timestamp
			if meta.Stream == s.cfg.Stream {
				nm.StreamCreated = s.streamCreated
			}
		}
		d, err := decodeNATS(nm, s.cfg.SubjectPrefix, s.cfg.MaxPayloadBytes)
		if err != nil {
			s.log.Error("message without JetStream metadata left unacknowledged",
				slog.String("subject", nm.Subject), slog.Any("error", err))
			continue
		}
		d.Ack = func(context.Context) error { return m.Ack() }
		d.InProgress = func(context.Context) error { return m.InProgress() }
		d.FirstDelivery = first
		out = append(out, d)
	}
	return out
}

// natsMessage is a JetStream message reduced to what decodeNATS reads.
// Keeping it a plain struct makes decodeNATS a pure function.
type natsMessage struct {
	// Subject is the subject the message was published to.
	Subject string
	// Header holds the message headers (case-sensitive, as in NATS).
	Header map[string][]string
	// Data is the message body: the event payload.
	Data []byte
	// Stream is the JetStream stream that stored the message.
	Stream string
	// StreamSeq is the message's sequence number in Stream. Together with
	// Stream and StreamCreated it identifies the message when it carries no
	// usable event id.
	StreamSeq uint64
	// StreamCreated is when Stream was created. Sequence numbers start again
	// at 1 in a re-created stream; the creation time tells the two apart.
	StreamCreated time.Time
	// Timestamp is when the stream stored the message; it stands in for a
	// missing occurred-at header.
	Timestamp time.Time
}

// decodeNATS maps a JetStream message onto broker.Received and decodes it: the
// headers are pgrelay's logical ones as they are, Nats-Msg-Id stands in for a
// missing event id, the subject without the prefix for a missing topic, and
// the stream position gives the stand-in id.
func decodeNATS(m natsMessage, subjectPrefix string, maxPayloadBytes int) (broker.Delivery, error) {
	r := broker.Received{Headers: m.Header, Payload: m.Data, BrokerIDName: MsgIDHeader, Timestamp: m.Timestamp}
	if vs := m.Header[MsgIDHeader]; len(vs) > 0 {
		r.BrokerID = vs[0]
	}
	r.Topic = m.Subject
	if subjectPrefix != "" && strings.HasPrefix(r.Topic, subjectPrefix+".") {
		r.Topic = r.Topic[len(subjectPrefix)+1:]
	}
	stream, _ := broker.StorableText(m.Stream)
	if m.Stream != "" && m.StreamSeq != 0 {
		r.FallbackID = FallbackEventID(stream, m.StreamCreated, m.StreamSeq)
	}
	d, err := broker.Decode(r, broker.DecodeOptions{MaxPayloadBytes: maxPayloadBytes})
	if err != nil {
		return d, err
	}
	if m.StreamSeq != 0 {
		d.Ref = "stream " + broker.Printable(stream) + " seq " + strconv.FormatUint(m.StreamSeq, 10)
	} else {
		d.Ref = "subject " + broker.Printable(m.Subject)
	}
	return d, nil
}

// FallbackEventID is the stable id given to a JetStream message without
// a usable event id: "nats:<stream>:<stream creation time, Unix
// nanoseconds>:<stream seq>". A redelivery of the same stream message gets
// the same id, so the inbox still deduplicates it; a message of a re-created
// stream (whose sequence numbers start again at 1) gets another, so it is
// never taken for a duplicate of an old one. Without a creation time the id
// is "nats:<stream>:<stream seq>".
func FallbackEventID(stream string, created time.Time, seq uint64) string {
	if created.IsZero() {
		return "nats:" + stream + ":" + strconv.FormatUint(seq, 10)
	}
	return "nats:" + stream + ":" + strconv.FormatInt(created.UnixNano(), 10) + ":" + strconv.FormatUint(seq, 10)
}

// attach finds (or creates) the stream, checks that it cannot replay an event
// past the dedup window, and creates or updates the durable pull consumer.
func (s *Subscriber) attach(ctx context.Context) error {
	cons, err := s.attachOnce(ctx)
	if err == nil {
		s.cons, s.checked = cons, time.Now()
		s.log.Info("consuming", slog.String("stream", s.cfg.Stream), slog.String("durable", s.cfg.Durable),
			slog.String("filter", s.cfg.FilterSubject))
		return nil
	}
	var rw *ReplayWindowError
	switch {
	case errors.As(err, &rw):
		return broker.Terminal(err)
	case !s.nc.IsConnected():
		return fmt.Errorf("not connected to NATS at %s (%s): %w", RedactURLs(s.cfg.URL), s.nc.Status(), err)
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return fmt.Errorf("stream not found; waiting for the relay to create it (or set --create-stream): %w", err)
	default:
		return fmt.Errorf("cannot attach to the JetStream consumer yet: %w", err)
	}
}

func (s *Subscriber) attachOnce(ctx context.Context) (jetstream.Consumer, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var info *jetstream.StreamInfo
	if s.cfg.CreateStream {
		var err error
		if info, err = ensureStream(ctx, s.js, s.streamSpec(), s.log); err != nil {
			return nil, err
		}
	} else {
		st, err := s.js.Stream(ctx, s.cfg.Stream)
		if err != nil {
			return nil, fmt.Errorf("stream %q: %w", s.cfg.Stream, err)
		}
		info = st.CachedInfo()
	}
	if err := s.checkReplayWindow(info.Config); err != nil {
		return nil, err
	}
	s.streamCreated = info.Created
	cfg := jetstream.ConsumerConfig{
		Durable:       s.cfg.Durable,
		FilterSubject: s.cfg.FilterSubject,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       s.cfg.AckWait,
		// Unlimited redeliveries: JetStream would otherwise drop a message
		// silently after MaxDeliver attempts, and nothing may be lost.
		MaxDeliver:    -1,
		MaxAckPending: s.cfg.MaxAckPending,
	}
	existing, err := s.js.Consumer(ctx, s.cfg.Stream, s.cfg.Durable)
	switch {
	case err == nil:
		// Where it delivers from is fixed at creation.
		cfg.DeliverPolicy, cfg.OptStartTime = existing.CachedInfo().Config.DeliverPolicy, existing.CachedInfo().Config.OptStartTime
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		// A new durable, or one that was lost: deliver from now minus the
		// dedup window, never from the start of the stream. An older message
		// may be an event processed so long ago that retention deleted its
		// inbox row, and a replay would apply it again.
		from := time.Now().Add(-s.cfg.DedupWindow)
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &from
		s.log.Info("creating the durable consumer, delivering messages stored since now minus the dedup window",
			slog.String("durable", s.cfg.Durable), slog.Time("from", from), slog.Duration("dedup_window", s.cfg.DedupWindow))
	default:
		return nil, fmt.Errorf("durable consumer %q on stream %q: %w", s.cfg.Durable, s.cfg.Stream, err)
	}
	cons, err := s.js.CreateOrUpdateConsumer(ctx, s.cfg.Stream, cfg)
	if err != nil {
		return nil, fmt.Errorf("durable consumer %q on stream %q: %w", s.cfg.Durable, s.cfg.Stream, err)
	}
	return cons, nil
}

// ReplayWindowError is the refusal of a stream that can deliver an event
// again after its inbox row left the dedup window.
type ReplayWindowError struct {
	Stream string
	// MaxAge is the stream's MaxAge (zero: no limit), Duplicates its duplicate
	// window, DedupWindow the inbox's.
	MaxAge, Duplicates, DedupWindow time.Duration
}

func (e *ReplayWindowError) Error() string { return e.fieldError().Error() }

// fieldError is e as the *setting.FieldError of the settings it names, which
// wraps e.
func (e *ReplayWindowError) fieldError() *setting.FieldError {
	maxAge := "unlimited"
	if e.MaxAge > 0 {
		maxAge = e.MaxAge.String()
	}
	fe := setting.Errorf("", "nats.Config", "DedupWindow", "stream %s keeps messages for MaxAge %s (duplicate window %s), "+
		"longer than the inbox dedup window {} %s: a replay of the stream (a lost durable consumer, a new one) "+
		"could deliver events whose inbox rows retention already deleted, and apply them again. "+
		"Give the stream a MaxAge within the window (the relay's --stream-max-age for a stream it creates, or "+
		"nats stream edit %s --max-age), raise {}, or accept the risk with "+
		"{AllowReplayBeyondDedupWindow}", e.Stream, maxAge, e.Duplicates, e.DedupWindow, e.Stream)
	fe.Cause = e
	return fe
}

// checkReplayWindow refuses a stream whose messages (MaxAge, zero meaning
// forever) or duplicate window outlive the dedup window, unless
// AllowReplayBeyondDedupWindow is set; then it only warns.
func (s *Subscriber) checkReplayWindow(sc jetstream.StreamConfig) error {
	if sc.MaxAge > 0 && sc.MaxAge <= s.cfg.DedupWindow && sc.Duplicates <= s.cfg.DedupWindow {
		return nil
	}
	err := &ReplayWindowError{Stream: sc.Name, MaxAge: sc.MaxAge, Duplicates: sc.Duplicates, DedupWindow: s.cfg.DedupWindow}
	if !s.cfg.AllowReplayBeyondDedupWindow {
		return err.fieldError()
	}
	s.log.Warn("replays beyond the dedup window allowed", slog.String("risk", err.Error()))
	return nil
}

// streamSpec is the stream the subscriber creates when CreateStream is set:
// the relay's settings, with a MaxAge that stays within the dedup window.
func (s *Subscriber) streamSpec() StreamSpec {
	return StreamSpec{Name: s.cfg.Stream, SubjectPrefix: s.cfg.SubjectPrefix,
		MaxAge: min(DefaultStreamMaxAge, s.cfg.DedupWindow)}
}

// recordingDialer dials like the NATS client's default dialer and keeps the
// last failure, which the client itself reports only as "no servers
// available".
type recordingDialer struct {
	net.Dialer
	mu   sync.Mutex
	last error
}

func (d *recordingDialer) Dial(network, address string) (net.Conn, error) {
	conn, err := d.Dialer.Dial(network, address)
	if err != nil {
		d.mu.Lock()
		d.last = err
		d.mu.Unlock()
	}
	return conn, err
}

func (d *recordingDialer) lastError() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.last
}

// RedactURLs returns a comma-separated list of server URLs with any password
// replaced by "xxxxx", for messages.
func RedactURLs(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if u, err := url.Parse(p); err == nil && u.User != nil {
			p = u.Redacted()
		}
		parts[i] = p
	}
	return strings.Join(parts, ",")
}

// MsgIDHeader is JetStream's dedup header; pgrelay sets it to the event
// id, and the subscriber reads it when Pgrelay-Event-Id is missing.
const MsgIDHeader = "Nats-Msg-Id"

var _ broker.Subscriber = (*Subscriber)(nil)
