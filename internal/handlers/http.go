package handlers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/db"
	"github.com/pgrelay/pgrelay/internal/event"
)

// DefaultHTTPTimeout bounds one webhook request.
const DefaultHTTPTimeout = 5 * time.Second

// HTTPConfig configures an HTTP handler.
type HTTPConfig struct {
	// URL is the webhook each event is POSTed to (http or https). Required.
	URL string
	// Timeout bounds one request, response body included; a request that
	// takes longer is a transient failure. Default DefaultHTTPTimeout.
	Timeout time.Duration
	// Client sends the requests. Default: a client of its own.
	Client *http.Client
	// Recorder is where a failed attempt's response status and latency are
	// recorded on the inbox row (usually the pool): a failed attempt's
	// transaction is rolled back, so it cannot carry them. A successful
	// attempt records them in its own transaction. Default nil: failed
	// attempts are not recorded (their reason still names the status).
	Recorder db.DBTX
	// Logger receives the handler's logs. Default: a no-op logger.
	Logger *slog.Logger
}

// HTTP is an inbox handler that POSTs each event to a webhook: the payload as
// the body, Idempotency-Key set to the event id (a retry repeats it, so the
// receiver can drop what it already applied), the event's fields as Pgrelay-*
// headers (Pgrelay-Key-Seq when it has a per-key sequence) and its own headers
// under their names. A 2xx answer is success; a
// 4xx is permanent except 408, 409, 425 and 429; a 5xx, a timeout or a
// connection error is transient and retried with backoff. The status and
// latency of the last attempt are recorded on the inbox row
// (handler_status, handler_latency_ms).
type HTTP struct {
	cfg HTTPConfig
	log *slog.Logger
}

// ExternalEffects reports true: a webhook call is not undone by a rollback,
// so the inbox worker commits each event on its own and never repeats a call
// that answered 2xx because another event failed (pgrelay.ExternalHandler).
func (h *HTTP) ExternalEffects() bool { return true }

var _ pgrelay.ExternalHandler = (*HTTP)(nil)

// NewHTTP checks cfg and returns the handler; errors name the field.
func NewHTTP(cfg HTTPConfig) (*HTTP, error) {
	u, err := url.Parse(cfg.URL)
	switch {
	case cfg.URL == "":
		return nil, errors.New("HTTPConfig.URL is required")
	case err != nil:
		return nil, fmt.Errorf("HTTPConfig.URL %q: %w", cfg.URL, err)
	case u.Scheme != "http" && u.Scheme != "https", u.Host == "":
		return nil, fmt.Errorf("HTTPConfig.URL %q must be an absolute http or https URL", u.Redacted())
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultHTTPTimeout
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("HTTPConfig.Timeout %s must be positive", cfg.Timeout)
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &HTTP{cfg: cfg, log: cfg.Logger.With(slog.String("logger", "http-handler"))}, nil
}

// reservedHeaders are set by the handler itself; an event header of the same
// name is not sent.
var reservedHeaders = map[string]bool{
	"Host": true, "Content-Length": true, "Content-Type": true, "Transfer-Encoding": true,
	"Connection": true, "Idempotency-Key": true, "Te": true, "Trailer": true, "Upgrade": true,
	"Keep-Alive": true, "Proxy-Connection": true, "Expect": true,
}

// Handle POSTs ev and maps the answer to the inbox's outcome.
func (h *HTTP) Handle(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
	rctx, cancel := context.WithTimeout(ctx, h.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, h.cfg.URL, strings.NewReader(string(ev.Payload)))
	if err != nil {
		return pgrelay.Permanent(fmt.Errorf("webhook request: %w", err))
	}
	for k, v := range ev.Headers {
		name := textproto.CanonicalMIMEHeaderKey(k)
		if reservedHeaders[name] || strings.HasPrefix(name, "Pgrelay-") || !validHeaderName(k) || !validHeaderValue(v) {
			continue
		}
		req.Header.Set(name, v)
	}
	req.Header.Set("Content-Type", contentType(ev))
	req.Header.Set("Idempotency-Key", ev.EventID)
	req.Header.Set(event.HeaderEventID, ev.EventID)
	req.Header.Set(event.HeaderEventType, ev.EventType)
	req.Header.Set(event.HeaderTopic, ev.Topic)
	req.Header.Set(event.HeaderKey, ev.Key)
	if ev.KeySeq > 0 {
		req.Header.Set(event.HeaderKeySeq, strconv.FormatInt(ev.KeySeq, 10))
	}
	req.Header.Set(event.HeaderOccurredAt, ev.OccurredAt.UTC().Format(time.RFC3339Nano))
	req.Header.Set("Pgrelay-Attempt", strconv.Itoa(ev.Attempts))

	start := time.Now()
	resp, err := h.cfg.Client.Do(req)
	var body []byte
	if err == nil {
		body, err = io.ReadAll(io.LimitReader(resp.Body, 1024))
		_ = resp.Body.Close()
		if err != nil {
			err = fmt.Errorf("reading the response of %s: %w", resp.Status, err)
			resp = nil
		}
	}
	latency := time.Since(start)
	ms := float64(latency.Microseconds()) / 1000
	if err != nil {
		h.record(ctx, ev, nil, ms)
		return fmt.Errorf("webhook POST failed after %.0fms: %w", ms, err)
	}
	status := int32(resp.StatusCode)
	switch code := resp.StatusCode; {
	case code >= 200 && code < 300:
		// Recorded with the processed mark: both commit or neither does.
		if err := db.New().RecordHandlerResponse(ctx, tx, db.RecordHandlerResponseParams{
			Status: &status, LatencyMs: ms, Handler: ev.Handler, DedupKey: ev.DedupKey, LockVersion: ev.LockVersion,
		}); err != nil {
			return fmt.Errorf("recording the webhook response: %w", err)
		}
		return nil
	case code >= 400 && code < 500 && code != 408 && code != 409 && code != 425 && code != 429:
		h.record(ctx, ev, &status, ms)
		return pgrelay.Permanent(fmt.Errorf("webhook answered %s after %.0fms: %s", resp.Status, ms, snippet(body)))
	default:
		h.record(ctx, ev, &status, ms)
		return fmt.Errorf("webhook answered %s after %.0fms: %s", resp.Status, ms, snippet(body))
	}
}

// record stores a failed attempt's response outside its transaction, which is
// about to roll back. Best effort: a failure is logged, never returned.
func (h *HTTP) record(ctx context.Context, ev *pgrelay.InboxEvent, status *int32, ms float64) {
	if h.cfg.Recorder == nil {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := db.New().RecordHandlerResponse(rctx, h.cfg.Recorder, db.RecordHandlerResponseParams{
		Status: status, LatencyMs: ms, Handler: ev.Handler, DedupKey: ev.DedupKey, LockVersion: ev.LockVersion,
	}); err != nil {
		h.log.Warn("recording a failed webhook attempt", slog.String("event_id", ev.EventID), slog.Any("error", err))
	}
}

// contentType is the request's Content-Type: the event's own when it has
// one, else JSON for a JSON payload and raw bytes otherwise.
func contentType(ev *pgrelay.InboxEvent) string {
	if ct := ev.ContentType; ct != "" && validHeaderValue(ct) {
		return ct
	}
	if ct := ev.Headers["Content-Type"]; ct != "" && validHeaderValue(ct) {
		return ct
	}
	if jsonLike(ev.Payload) {
		return "application/json"
	}
	return "application/octet-stream"
}

func jsonLike(b []byte) bool {
	s := strings.TrimSpace(string(b))
	return len(s) > 0 && (s[0] == '{' || s[0] == '[')
}

func snippet(body []byte) string {
	s := strings.TrimSpace(strings.ToValidUTF8(string(body), "\uFFFD"))
	if s == "" {
		return "(empty body)"
	}
	return strconv.Quote(s)
}

// validHeaderName reports whether s is an HTTP token (RFC 9110).
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0 {
			continue
		}
		return false
	}
	return true
}

// validHeaderValue reports whether s can be sent as a header value.
func validHeaderValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}
