package metrics

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Check reports whether a dependency is reachable. It must honour ctx.
type Check func(ctx context.Context) error

// PingCheck returns a Check that pings the database.
func PingCheck(pool *pgxpool.Pool) Check {
	return func(ctx context.Context) error { return pool.Ping(ctx) }
}

// ServerConfig configures the metrics and health server.
type ServerConfig struct {
	// Addr is the listen address. Default: ":9090" (every interface: the
	// endpoints expose no data that needs protecting; bind to loopback to
	// keep them private).
	Addr string
	// Registry is the service's registry, served on /metrics. Required.
	Registry *prometheus.Registry
	// Checks are run by /readyz, each named (for example "database",
	// "broker"); the service is ready when all pass. Default: none (always
	// ready).
	Checks map[string]Check
	// CheckTimeout bounds each readiness check. Default: 2s.
	CheckTimeout time.Duration
	// Logger receives serving errors. Default: a no-op logger.
	Logger *slog.Logger
	// ShutdownTimeout bounds the graceful shutdown. Default: 5s.
	ShutdownTimeout time.Duration
}

// WithDefaults returns a copy of c with every unset field at its default.
func (c ServerConfig) WithDefaults() ServerConfig {
	if c.Addr == "" {
		c.Addr = ":9090"
	}
	if c.CheckTimeout == 0 {
		c.CheckTimeout = 2 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = 5 * time.Second
	}
	return c
}

func (c ServerConfig) validate() error {
	if c.Registry == nil {
		return errors.New("metrics: ServerConfig.Registry is required")
	}
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		return fmt.Errorf("metrics: invalid metrics address %q (--metrics-addr / METRICS_ADDR): %w", c.Addr, err)
	}
	if c.CheckTimeout < 0 {
		return fmt.Errorf("metrics: ServerConfig.CheckTimeout must be positive, got %s", c.CheckTimeout)
	}
	for name, f := range c.Checks {
		if f == nil {
			return fmt.Errorf("metrics: ServerConfig.Checks[%q] is nil", name)
		}
	}
	return nil
}

// Server serves /metrics (Prometheus), /livez and /healthz (the process is up) and
// /readyz (every check passes).
type Server struct {
	cfg     ServerConfig
	handler http.Handler
}

// NewServer checks the configuration and returns a Server.
func NewServer(cfg ServerConfig) (*Server, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(cfg.Registry, promhttp.HandlerOpts{
		ErrorLog:      slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelError),
		ErrorHandling: promhttp.ContinueOnError,
		Timeout:       30 * time.Second,
	}))
	alive := func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	}
	mux.HandleFunc("GET /livez", alive) // Kubernetes' name
	mux.HandleFunc("GET /healthz", alive)
	mux.HandleFunc("GET /readyz", s.readyz)
	s.handler = recoverer(cfg.Logger, mux)
	return s, nil
}

// Handler returns the server's handler.
func (s *Server) Handler() http.Handler { return s.handler }

// Run listens on Addr and serves until ctx is cancelled, then shuts down
// gracefully.
func (s *Server) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("metrics: listen on %s (--metrics-addr / METRICS_ADDR): %w", s.cfg.Addr, err)
	}
	return s.Serve(ctx, ln)
}

// Serve serves on ln until ctx is cancelled.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: 10 * time.Second,
		WriteTimeout:      time.Minute,
		IdleTimeout:       2 * time.Minute,
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	s.cfg.Logger.Info("metrics and health endpoints listening", slog.String("addr", ln.Addr().String()))
	select {
	case err := <-errc:
		return fmt.Errorf("metrics: serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("metrics: shutdown: %w", err)
	}
	return nil
}

// readyzBody is /readyz's JSON answer: "ok" or the error, per check.
type readyzBody struct {
	Ready  bool              `json:"ready"`
	Checks map[string]string `json:"checks"`
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	names := make([]string, 0, len(s.cfg.Checks))
	for name := range s.cfg.Checks {
		names = append(names, name)
	}
	sort.Strings(names)
	body := readyzBody{Ready: true, Checks: make(map[string]string, len(names))}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, name := range names {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(r.Context(), s.cfg.CheckTimeout)
			defer cancel()
			err := runCheck(ctx, s.cfg.CheckTimeout, s.cfg.Checks[name])
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				body.Ready = false
				body.Checks[name] = err.Error()
				return
			}
			body.Checks[name] = "ok"
		})
	}
	wg.Wait()
	status := http.StatusOK
	if !body.Ready {
		status = http.StatusServiceUnavailable
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

// runCheck runs a check, turning a panic into an error.
// runCheck runs f under ctx's deadline. A check that outlives the deadline
// fails, whatever it returns later and even when it ignores ctx: a check that
// cannot answer in time is not ready.
func runCheck(ctx context.Context, timeout time.Duration, f Check) error {
	done := make(chan error, 1)
	go func() {
		defer func() {
			if v := recover(); v != nil {
				done <- fmt.Errorf("check panicked: %v", v)
			}
		}()
		done <- f(ctx)
	}()
	select {
	case err := <-done:
		if err == nil && ctx.Err() != nil {
			return fmt.Errorf("check timed out after %s", timeout)
		}
		return err
	case <-ctx.Done():
		return fmt.Errorf("check timed out after %s", timeout)
	}
}

func recoverer(log *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				log.Error("metrics handler panicked", slog.Any("panic", v), slog.String("path", r.URL.Path))
				http.Error(w, "internal error", http.StatusInternalServerError)
			}
		}()
		next.ServeHTTP(w, r)
	})
}
