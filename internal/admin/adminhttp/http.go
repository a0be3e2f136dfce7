// Package adminhttp serves the admin HTTP API over admin.Service.
package adminhttp

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/pgrelay/pgrelay/internal/admin"
)

// ServerConfig configures the admin HTTP API.
type ServerConfig struct {
	// Service runs the operations. Required unless Databases is set.
	Service *admin.Service
	// Databases, when set, are the databases served: a request names one
	// with its database parameter (none: the first), GET /v1/databases
	// lists them. Default: Service alone.
	Databases admin.Databases
	// Addr is the listen address. Default: 127.0.0.1:9091 (loopback only).
	Addr string
	// Token is the bearer token every request must present
	// ("Authorization: Bearer TOKEN"). Optional on a loopback address;
	// required on any other (the server refuses to start without it). When
	// set, it is required on loopback too. Default: empty.
	Token string
	// Logger receives request errors. Default: a no-op logger.
	Logger *slog.Logger
	// ShutdownTimeout bounds the graceful shutdown. Default: 10s.
	ShutdownTimeout time.Duration
	// Console, when set, is served under /console/ (and / redirects to
	// it). It applies the same token rules itself (internal/console), with
	// a sign-in for browsers. Default: nil, no console.
	Console http.Handler
}

// WithDefaults returns a copy of c with every unset field at its default.
func (c ServerConfig) WithDefaults() ServerConfig {
	if c.Addr == "" {
		c.Addr = "127.0.0.1:9091"
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = 10 * time.Second
	}
	if c.Databases.Names == nil && c.Service != nil {
		c.Databases = admin.One("", c.Service)
	}
	return c
}

func (c ServerConfig) validate() error {
	if c.Service == nil && c.Databases.Names == nil {
		return errors.New("admin: ServerConfig.Service (or Databases) is required")
	}
	loopback, err := IsLoopback(c.Addr)
	if err != nil {
		return fmt.Errorf("admin: invalid admin address %q (--admin-addr / ADMIN_ADDR): %w", c.Addr, err)
	}
	if !loopback && c.Token == "" {
		return fmt.Errorf("admin: the admin API listens on %q, which is not loopback: set a bearer token (--admin-token / ADMIN_TOKEN) or bind it to 127.0.0.1", c.Addr)
	}
	if c.Token != "" && len(c.Token) < 16 {
		return errors.New("admin: the admin token (--admin-token / ADMIN_TOKEN) must be at least 16 characters")
	}
	return nil
}

// IsLoopback reports whether a listen address (host:port) binds only the
// loopback interface. An empty host binds every interface, so it is not
// loopback; of host names only "localhost" is.
func IsLoopback(addr string) (bool, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false, err
	}
	if host == "localhost" {
		return true, nil
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback(), nil
}

// Server is the admin HTTP API.
type Server struct {
	cfg       ServerConfig
	tokenHash [32]byte
	handler   http.Handler
}

// NewServer checks the configuration and returns a Server. It fails when the
// address is not loopback and no token is set.
func NewServer(cfg ServerConfig) (*Server, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, tokenHash: sha256.Sum256([]byte(cfg.Token))}
	s.handler = s.routes()
	return s, nil
}

// Handler returns the API's handler (authentication included).
func (s *Server) Handler() http.Handler { return s.handler }

// Run listens on Addr and serves until ctx is cancelled, then shuts down
// gracefully.
func (s *Server) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("admin: listen on %s (--admin-addr / ADMIN_ADDR): %w", s.cfg.Addr, err)
	}
	return s.Serve(ctx, ln)
}

// Serve serves on ln until ctx is cancelled.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      2 * time.Minute,
		IdleTimeout:       2 * time.Minute,
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	s.cfg.Logger.Info("admin API listening", slog.String("addr", ln.Addr().String()))
	select {
	case err := <-errc:
		return fmt.Errorf("admin: serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("admin: shutdown: %w", err)
	}
	return nil
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/stats", s.handleStats)
	mux.HandleFunc("GET /v1/{source}/dead", s.handleList)
	mux.HandleFunc("GET /v1/{source}/dead/{id}", s.handleShow)
	mux.HandleFunc("POST /v1/{source}/dead/requeue", s.handleRequeue)
	mux.HandleFunc("POST /v1/{source}/dead/purge", s.handlePurge)
	mux.HandleFunc("GET /v1/audit", s.handleAudit)
	mux.HandleFunc("GET /v1/dedup", s.handleDedup)
	mux.HandleFunc("POST /v1/dedup/reset", s.handleDedupReset)
	mux.HandleFunc("GET /v1/inbox/keys", s.handleInboxKeys)
	mux.HandleFunc("GET /v1/outbox/partitions", s.handleOutbox)
	mux.HandleFunc("GET /v1/inbox/conflicts", s.handleConflicts)
	mux.HandleFunc("GET /v1/inbox/gaps", s.handleGaps)
	mux.HandleFunc("POST /v1/inbox/gaps/skip", s.handleGapSkip)
	mux.HandleFunc("POST /v1/inbox/dead/skip", s.handleDeadSkip)
	mux.HandleFunc("GET /v1/databases", s.handleDatabases)
	api := s.recoverer(s.browserGuard(s.authenticate(s.pick(mux))))
	if s.cfg.Console == nil {
		return api
	}
	root := http.NewServeMux()
	root.Handle("/", api)
	root.Handle("/console/", s.cfg.Console)
	root.Handle("GET /{$}", http.RedirectHandler("/console/", http.StatusSeeOther))
	return root
}

// browserGuard refuses what only a browser tricked by another site sends:
// without a token (loopback), a Host header that names no loopback address
// (a page that rebound its domain name to 127.0.0.1, 421); and a POST from
// another origin (Origin, Sec-Fetch-Site), which could otherwise reach a
// token-less API as a "simple" cross-site request (403). Clients other than
// browsers send neither header and are not affected.
func (s *Server) browserGuard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.Token == "" && !admin.LoopbackHost(r.Host) {
			writeError(w, http.StatusMisdirectedRequest, "without a token the admin API answers only to a loopback host name (127.0.0.1, ::1 or localhost)")
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
				writeError(w, http.StatusForbidden, "cross-site request refused (Sec-Fetch-Site: "+site+")")
				return
			}
			if o := r.Header.Get("Origin"); o != "" {
				if u, err := url.Parse(o); err != nil || u.Host != r.Host {
					writeError(w, http.StatusForbidden, "request from another origin refused (Origin: "+o+")")
					return
				}
			}
		}
		next.ServeHTTP(w, r)
	})
}

func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.Token != "" {
			got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			// Hashing both sides first makes the comparison constant-time
			// in the token's length as well as its content.
			h := sha256.Sum256([]byte(got))
			if !ok || subtle.ConstantTimeCompare(h[:], s.tokenHash[:]) != 1 {
				w.Header().Set("WWW-Authenticate", `Bearer realm="pgrelay-admin"`)
				writeError(w, http.StatusUnauthorized, "a valid bearer token is required")
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

type serviceKey struct{}

// pick finds the database the request names (its database parameter; none
// is the first) and refuses an unknown one with 404, naming those served.
func (s *Server) pick(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		svc, err := s.cfg.Databases.Pick(r.URL.Query().Get("database"))
		if err != nil {
			s.fail(w, r, err)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), serviceKey{}, svc)))
	})
}

// service is the Service of the request's database (pick).
func service(r *http.Request) *admin.Service { return r.Context().Value(serviceKey{}).(*admin.Service) }

// handleDatabases lists the databases served, each pinged.
func (s *Server) handleDatabases(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.cfg.Databases.Status(r.Context()))
}

func (s *Server) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.cfg.Logger.Error("admin API handler panicked", slog.Any("panic", v),
					slog.String("method", r.Method), slog.String("path", r.URL.Path))
				writeError(w, http.StatusInternalServerError, "internal error")
			}
		}()
		next.ServeHTTP(w, r)
	})
}

type errorBody struct {
	Error string `json:"error"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, errorBody{Error: msg})
}

func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, admin.ErrInvalid):
		writeError(w, http.StatusBadRequest, err.Error())
	case errors.Is(err, admin.ErrStale):
		writeError(w, http.StatusConflict, err.Error())
	case errors.Is(err, admin.ErrNotFound):
		writeError(w, http.StatusNotFound, err.Error())
	case errors.Is(err, admin.ErrUnsupported):
		writeError(w, http.StatusNotImplemented, err.Error())
	default:
		s.cfg.Logger.Error("admin API request failed", slog.Any("error", err),
			slog.String("method", r.Method), slog.String("path", r.URL.Path))
		writeError(w, http.StatusInternalServerError, err.Error())
	}
}

func (s *Server) handleStats(w http.ResponseWriter, r *http.Request) {
	st, err := service(r).Stats(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

// filterFromQuery reads a Filter from URL parameters: handler, event_id,
// topic, type, key, error, since, until (RFC 3339) and limit.
func filterFromQuery(r *http.Request) (admin.Filter, error) {
	q := r.URL.Query()
	f := admin.Filter{Handler: q.Get("handler"), EventID: q.Get("event_id"), Topic: q.Get("topic"), EventType: q.Get("type"),
		Key: q.Get("key"), ErrorContains: q.Get("error")}
	for name, dst := range map[string]**time.Time{"since": &f.DeadAfter, "until": &f.DeadBefore} {
		if v := q.Get(name); v != "" {
			t, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				return f, fmt.Errorf("%w: %s=%q: want an RFC 3339 time", admin.ErrInvalid, name, v)
			}
			*dst = &t
		}
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return f, fmt.Errorf("%w: limit=%q: want a non-negative integer", admin.ErrInvalid, v)
		}
		f.Limit = n
	}
	return f, nil
}

func (s *Server) handleList(w http.ResponseWriter, r *http.Request) {
	f, err := filterFromQuery(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	list, err := service(r).ListDead(r.Context(), admin.Source(r.PathValue("source")), f)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, list)
}

func (s *Server) handleShow(w http.ResponseWriter, r *http.Request) {
	d, err := service(r).Show(r.Context(), admin.Source(r.PathValue("source")), r.PathValue("id"), r.URL.Query().Get("handler"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, d)
}

const maxBody = 1 << 20

func decodeBody(r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: request body: %v", admin.ErrInvalid, err)
	}
	return nil
}

func (s *Server) handleRequeue(w http.ResponseWriter, r *http.Request) {
	var req admin.RequeueRequest
	if err := decodeBody(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	res, err := service(r).Requeue(r.Context(), admin.Source(r.PathValue("source")), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// purgeBody is PurgeRequest on the wire: older_than is a Go duration string.
type purgeBody struct {
	Filter    admin.Filter `json:"filter"`
	OlderThan string       `json:"older_than"`
	Actor     string       `json:"actor"`
	Reason    string       `json:"reason,omitempty"`
	DryRun    bool         `json:"dry_run,omitempty"`
	Confirm   string       `json:"confirm,omitempty"`
}

func (s *Server) handlePurge(w http.ResponseWriter, r *http.Request) {
	var body purgeBody
	if err := decodeBody(r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	req := admin.PurgeRequest{Filter: body.Filter, Actor: body.Actor, Reason: body.Reason, DryRun: body.DryRun, Confirm: body.Confirm}
	if body.OlderThan != "" {
		d, err := time.ParseDuration(body.OlderThan)
		if err != nil {
			s.fail(w, r, fmt.Errorf("%w: older_than=%q: want a duration such as 720h", admin.ErrInvalid, body.OlderThan))
			return
		}
		req.OlderThan = &d
	}
	res, err := service(r).Purge(r.Context(), admin.Source(r.PathValue("source")), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (s *Server) handleAudit(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit, err := queryInt(r, "limit")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	list, err := service(r).Audit(r.Context(), q.Get("event_id"), admin.Source(q.Get("source")), limit)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, list)
}

func queryInt(r *http.Request, name string) (int, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%w: %s=%q: want a non-negative integer", admin.ErrInvalid, name, v)
	}
	return n, nil
}

func (s *Server) handleDedup(w http.ResponseWriter, r *http.Request) {
	n, err := queryInt(r, "recent")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	rep, err := service(r).Dedup(r.Context(), n)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, rep)
}

// resetBody is the body of POST /v1/dedup/reset.
type resetBody struct {
	Actor  string `json:"actor"`
	Reason string `json:"reason,omitempty"`
}

func (s *Server) handleDedupReset(w http.ResponseWriter, r *http.Request) {
	var body resetBody
	if err := decodeBody(r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	id, err := service(r).ResetDedupStats(r.Context(), body.Actor, body.Reason)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]int64{"audit_id": id})
}

func (s *Server) handleInboxKeys(w http.ResponseWriter, r *http.Request) {
	n, err := queryInt(r, "limit")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	keys, err := service(r).InboxKeys(r.Context(), r.URL.Query().Get("search"), n)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, keys)
}

func (s *Server) handleOutbox(w http.ResponseWriter, r *http.Request) {
	ov, err := service(r).Outbox(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, ov)
}

// handleConflicts lists recorded key conflicts: GET /v1/inbox/conflicts with
// optional handler, event_id and limit parameters.
func (s *Server) handleConflicts(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit, err := queryInt(r, "limit")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	list, err := service(r).ListConflicts(r.Context(), q.Get("handler"), q.Get("event_id"), limit)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, list)
}
