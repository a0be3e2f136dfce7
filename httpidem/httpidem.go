// Package httpidem is net/http middleware for the Idempotency-Key request
// header (draft-ietf-httpapi-idempotency-key-header): a request retried with
// the same key gets the first request's response again instead of running
// twice.
//
// The first request with a key runs inside a PostgreSQL transaction that the
// handler takes from the request context (Tx) for its own writes; its
// response (status, the chosen headers, body) is stored in the same
// transaction, so either both the handler's writes and the stored response
// commit, or neither does. While that request runs, the key is held by a
// transaction-scoped advisory lock: a concurrent request with the same key
// gets 409 Conflict at once, and a crash (process killed, connection lost)
// frees the key with nothing half stored. See docs/idempotency.md.
package httpidem

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/internal/db"
)

// HeaderName is the request header carrying the key.
const HeaderName = "Idempotency-Key"

// ReplayedHeader is set to "true" on a response served from storage.
const ReplayedHeader = "Idempotent-Replayed"

// MaxKeyLength is the longest key accepted, in bytes.
const MaxKeyLength = 255

// Config configures a Middleware.
type Config struct {
	// Pool is the database holding the http_idempotency_keys table and the
	// handler's own tables. Required.
	Pool *pgxpool.Pool
	// TTL is how long a stored response is replayed; after it the key may be
	// used again and Clean deletes it. Default: 24h.
	TTL time.Duration
	// Methods are the request methods the middleware applies to; others pass
	// through untouched, without a transaction. Default: POST and PATCH, the
	// methods the draft names as not idempotent.
	Methods []string
	// Optional lets a request without the header run as if no middleware
	// were there (no transaction in the context). Default: false, such a
	// request gets 400.
	Optional bool
	// StoreHeaders are the response headers stored and replayed beside the
	// status and body. Default: Content-Type, Location, ETag, Last-Modified.
	StoreHeaders []string
	// MaxBodyBytes bounds the request body read for the fingerprint; a
	// larger body gets 413. Default: 1 MiB.
	MaxBodyBytes int64
	// Scope returns the key space of a request (for example the
	// authenticated client's id), so that two clients' keys never meet.
	// A scope that is not valid UTF-8 or holds a NUL byte gets 400.
	// Default: one space for every request.
	Scope func(*http.Request) string
	// Logger receives failures of the store. Default: a no-op logger.
	Logger *slog.Logger
	// CleanBatchSize is how many expired keys one statement of Clean
	// deletes. Default: 1000.
	CleanBatchSize int
	// CleanTimeout bounds each statement of Clean. Default: 10s.
	CleanTimeout time.Duration
}

// WithDefaults returns a copy of c with every unset field at its default.
func (c Config) WithDefaults() Config {
	if c.TTL == 0 {
		c.TTL = 24 * time.Hour
	}
	if c.Methods == nil {
		c.Methods = []string{http.MethodPost, http.MethodPatch}
	}
	if c.StoreHeaders == nil {
		c.StoreHeaders = []string{"Content-Type", "Location", "ETag", "Last-Modified"}
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = 1 << 20
	}
	if c.Scope == nil {
		c.Scope = func(*http.Request) string { return "" }
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.CleanBatchSize == 0 {
		c.CleanBatchSize = 1000
	}
	if c.CleanTimeout == 0 {
		c.CleanTimeout = 10 * time.Second
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.Pool == nil:
		return errors.New("httpidem: Pool is required")
	case c.TTL < time.Second:
		return fmt.Errorf("httpidem: TTL must be at least 1s, got %s", c.TTL)
	case c.MaxBodyBytes < 0:
		return fmt.Errorf("httpidem: MaxBodyBytes must not be negative, got %d", c.MaxBodyBytes)
	case c.CleanBatchSize < 1:
		return fmt.Errorf("httpidem: CleanBatchSize must be positive, got %d", c.CleanBatchSize)
	case c.CleanTimeout < 0:
		return fmt.Errorf("httpidem: CleanTimeout must not be negative, got %s", c.CleanTimeout)
	}
	return nil
}

// Middleware stores and replays responses by Idempotency-Key. It is safe for
// concurrent use.
type Middleware struct {
	cfg Config
	q   *db.Queries
}

// New returns a Middleware, or an error naming the invalid Config field.
func New(cfg Config) (*Middleware, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Middleware{cfg: cfg, q: db.New()}, nil
}

type txKey struct{}

// Tx returns the transaction the middleware opened for this request; the
// handler does its writes in it and must neither commit nor roll it back.
// ok is false when the request did not go through the middleware's stored
// path (another method, or an optional key that was absent).
func Tx(ctx context.Context) (tx pgx.Tx, ok bool) {
	tx, ok = ctx.Value(txKey{}).(pgx.Tx)
	return tx, ok
}

// Fingerprint is the request fingerprint compared between a key's first
// request and its retries: SHA-256 over a version tag, then the method, the
// escaped path and the raw query, each prefixed by its length, then the
// SHA-256 of the body. Length prefixes make the encoding unambiguous: two
// different (method, path, query, body) tuples never share an input.
func Fingerprint(method, path, rawQuery string, body []byte) [32]byte {
	h := sha256.New()
	h.Write([]byte("pgrelay-httpidem-v1"))
	var n [binary.MaxVarintLen64]byte
	for _, s := range []string{method, path, rawQuery} {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
		h.Write([]byte(s))
	}
	b := sha256.Sum256(body)
	h.Write(b[:])
	var out [32]byte
	h.Sum(out[:0])
	return out
}

// ParseKey parses an Idempotency-Key field value. The draft defines it as a
// Structured Field String (a quoted string of printable ASCII with \" and \\
// escapes); a bare token of printable ASCII without quotes, spaces or commas
// is accepted too, as many clients send one. The key is 1 to MaxKeyLength
// bytes.
func ParseKey(v string) (string, error) {
	var key []byte
	if len(v) > 0 && v[0] == '"' {
		i := 1
		for ; i < len(v); i++ {
			c := v[i]
			if c == '\\' {
				i++
				if i >= len(v) || (v[i] != '"' && v[i] != '\\') {
					return "", errors.New("invalid escape in quoted key")
				}
				key = append(key, v[i])
				continue
			}
			if c == '"' {
				break
			}
			if c < 0x20 || c > 0x7e {
				return "", errors.New("key must be printable ASCII")
			}
			key = append(key, c)
		}
		if i != len(v)-1 {
			return "", errors.New("quoted key must end with its closing quote")
		}
	} else {
		for i := 0; i < len(v); i++ {
			c := v[i]
			if c <= 0x20 || c > 0x7e || c == '"' || c == ',' || c == '\\' {
				return "", errors.New("key must be a quoted string or printable ASCII without spaces, quotes, commas or backslashes")
			}
		}
		key = []byte(v)
	}
	switch {
	case len(key) == 0:
		return "", errors.New("key is empty")
	case len(key) > MaxKeyLength:
		return "", fmt.Errorf("key is longer than %d bytes", MaxKeyLength)
	}
	return string(key), nil
}

// Handler wraps next.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.serve(w, r, next)
	})
}

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if !slices.Contains(m.cfg.Methods, r.Method) {
		next.ServeHTTP(w, r)
		return
	}
	values := r.Header.Values(HeaderName)
	switch {
	case len(values) == 0 && m.cfg.Optional:
		next.ServeHTTP(w, r)
		return
	case len(values) == 0:
		problem(w, http.StatusBadRequest, "Idempotency-Key is missing", "This operation requires an Idempotency-Key header.")
		return
	case len(values) > 1:
		problem(w, http.StatusBadRequest, "Idempotency-Key is invalid", "Send exactly one Idempotency-Key header.")
		return
	}
	key, err := ParseKey(values[0])
	if err != nil {
		problem(w, http.StatusBadRequest, "Idempotency-Key is invalid", err.Error())
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, m.cfg.MaxBodyBytes+1))
	if err != nil {
		problem(w, http.StatusBadRequest, "Request body unreadable", err.Error())
		return
	}
	if int64(len(body)) > m.cfg.MaxBodyBytes {
		problem(w, http.StatusRequestEntityTooLarge, "Request body too large",
			fmt.Sprintf("An idempotent request body is limited to %d bytes.", m.cfg.MaxBodyBytes))
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	fp := Fingerprint(r.Method, r.URL.EscapedPath(), r.URL.RawQuery, body)
	scope := m.cfg.Scope(r)
	if !utf8.ValidString(scope) || strings.IndexByte(scope, 0) >= 0 {
		// Usually taken from the request (a client id): PostgreSQL text
		// cannot hold it, and no retry can change that, so it is the
		// request's fault, not an outage.
		problem(w, http.StatusBadRequest, "Idempotency scope is invalid",
			"The request's idempotency scope (for example its client id) is not valid UTF-8 or contains a NUL byte.")
		return
	}
	log := m.cfg.Logger.With(slog.String("idempotency_key", key), slog.String("scope", scope))

	ctx := r.Context()
	tx, err := m.cfg.Pool.Begin(ctx)
	if err != nil {
		log.Error("idempotency: begin", slog.Any("error", err))
		problem(w, http.StatusServiceUnavailable, "Idempotency store unavailable", "Retry later with the same key.")
		return
	}
	defer func() {
		// A no-op after Commit; otherwise undoes the handler's writes even
		// when the client has gone.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = tx.Rollback(rctx)
	}()

	locked, err := m.q.HTTPIdemTryLock(ctx, tx, db.HTTPIdemTryLockParams{Scope: scope, Key: key})
	if err != nil {
		log.Error("idempotency: lock key", slog.Any("error", err))
		problem(w, http.StatusServiceUnavailable, "Idempotency store unavailable", "Retry later with the same key.")
		return
	}
	if !locked {
		w.Header().Set("Retry-After", "1")
		problem(w, http.StatusConflict, "Request in progress",
			"A request with this Idempotency-Key is still being processed; retry later.")
		return
	}
	stored, err := m.q.HTTPIdemGet(ctx, tx, db.HTTPIdemGetParams{Scope: scope, Key: key})
	switch {
	case err == nil:
		if !bytes.Equal(stored.Fingerprint, fp[:]) {
			problem(w, http.StatusUnprocessableEntity, "Idempotency-Key reused",
				"This Idempotency-Key was used with a different request (method, path, query or body).")
			return
		}
		_ = tx.Rollback(ctx)
		replay(w, stored)
		return
	case !errors.Is(err, pgx.ErrNoRows):
		log.Error("idempotency: read key", slog.Any("error", err))
		problem(w, http.StatusServiceUnavailable, "Idempotency store unavailable", "Retry later with the same key.")
		return
	}

	rec := &recorder{header: make(http.Header), status: http.StatusOK}
	if !m.run(next, rec, r.WithContext(context.WithValue(ctx, txKey{}, tx)), log) {
		problem(w, http.StatusInternalServerError, "Internal error", "The request failed; nothing was stored, retry with the same key.")
		return
	}
	if rec.status >= 500 {
		// A server error is not an outcome to replay: its writes roll back
		// and the key stays free for a retry.
		_ = tx.Rollback(ctx)
		rec.writeTo(w)
		return
	}
	headers := map[string][]string{}
	for _, h := range m.cfg.StoreHeaders {
		if v := rec.header.Values(h); len(v) > 0 {
			headers[http.CanonicalHeaderKey(h)] = v
		}
	}
	hj, err := json.Marshal(headers)
	if err == nil {
		err = m.q.HTTPIdemStore(ctx, tx, db.HTTPIdemStoreParams{
			Scope: scope, Key: key, Fingerprint: fp[:], Method: r.Method, Path: r.URL.EscapedPath(),
			Status: int32(rec.status), Headers: hj, Body: rec.body.Bytes(), TtlSeconds: m.cfg.TTL.Seconds(),
		})
	}
	if err == nil {
		err = tx.Commit(ctx)
	}
	if err != nil {
		log.Error("idempotency: store response and commit", slog.Any("error", err))
		problem(w, http.StatusInternalServerError, "Internal error", "The request was not committed; retry with the same key.")
		return
	}
	rec.writeTo(w)
}

// run calls the handler, turning a panic into a failed run.
func (m *Middleware) run(next http.Handler, w http.ResponseWriter, r *http.Request, log *slog.Logger) (ok bool) {
	defer func() {
		if p := recover(); p != nil {
			if p == http.ErrAbortHandler {
				panic(p)
			}
			log.Error("idempotency: handler panicked; its writes roll back", slog.Any("panic", p))
			ok = false
		}
	}()
	next.ServeHTTP(w, r)
	return true
}

func replay(w http.ResponseWriter, s db.HTTPIdemGetRow) {
	var headers map[string][]string
	_ = json.Unmarshal(s.Headers, &headers)
	for k, v := range headers {
		w.Header()[k] = v
	}
	w.Header().Set(ReplayedHeader, "true")
	w.Header().Set("Content-Length", strconv.Itoa(len(s.Body)))
	w.WriteHeader(int(s.Status))
	_, _ = w.Write(s.Body)
}

// recorder buffers the handler's response until its transaction commits.
type recorder struct {
	header      http.Header
	status      int
	wroteHeader bool
	body        bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if !r.wroteHeader {
		r.status, r.wroteHeader = status, true
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	return r.body.Write(b)
}

func (r *recorder) writeTo(w http.ResponseWriter) {
	for k, v := range r.header {
		w.Header()[k] = v
	}
	w.WriteHeader(r.status)
	_, _ = w.Write(r.body.Bytes())
}

func problem(w http.ResponseWriter, status int, title, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"type": "about:blank", "title": title, "status": status, "detail": detail})
}

// Clean deletes expired keys in batches of CleanBatchSize, each its own
// statement bounded by CleanTimeout, until none is left or ctx ends. It
// returns how many it deleted. Run it periodically (for example hourly).
func (m *Middleware) Clean(ctx context.Context) (int64, error) {
	var total int64
	for {
		qctx, cancel := context.WithTimeout(ctx, m.cfg.CleanTimeout)
		n, err := m.q.HTTPIdemDeleteExpired(qctx, m.cfg.Pool, int32(m.cfg.CleanBatchSize))
		cancel()
		total += n
		if err != nil {
			return total, fmt.Errorf("httpidem: clean expired keys: %w", err)
		}
		if n < int64(m.cfg.CleanBatchSize) {
			return total, nil
		}
	}
}
