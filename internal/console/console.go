// Package console is pgrelay's web console: server-rendered HTML pages
// (written by typed functions in render.go, escaped as html/template
// escapes; the stylesheet embedded with go:embed; charts drawn as inline SVG
// on the server; no JavaScript) served on the relay's and the consumer's
// admin address next to the admin API, under the same token rules. Every
// read and every action calls the same admin.Service operations as the
// admin API, the CLI and the TUI.
//
// Security: when a token is set (required off loopback) a browser signs in
// once with it and gets a session cookie (HttpOnly, SameSite=Strict, valid
// for this process only); API clients may send the bearer header instead.
// Without a token (loopback only) the Host header must name a loopback
// address, so a DNS-rebound page cannot reach the console. Every POST must
// carry the page's CSRF token (an HMAC of a per-process secret) and, when
// the browser sends them, an Origin of this host and Sec-Fetch-Site
// same-origin. Actions are two-step: a review (a dry run for requeue and
// purge) issues a confirmation token bound to exactly the reviewed request,
// and only that token runs it.
package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgrelay/pgrelay/internal/admin"
)

//go:embed static/*
var assets embed.FS

// BrokerSettings are the broker's retention settings as the process reads
// them, shown on the relay page against the dedup window.
type BrokerSettings struct {
	// Kind names the broker ("NATS JetStream stream", "Kafka topic").
	Kind string
	// Name is the stream's or topic's name.
	Name string
	// MaxAge is how long the broker keeps a message; 0 means forever.
	MaxAge time.Duration
	// DuplicateWindow is the broker's own dedup window (0: none or unknown).
	DuplicateWindow time.Duration
	// Other are further settings, shown as they are.
	Other [][2]string
}

// Config configures the console.
type Config struct {
	// Service runs the reads and the actions. Required unless Databases
	// is set.
	Service *admin.Service
	// Databases, when set, are the databases served: a page names one with
	// its database parameter (none: the first), carried in its links; with
	// more than one a selector is shown. Default: Service alone.
	Databases admin.Databases
	// Program is "consumer" or "relay" (shown in the title). Default
	// "pgrelay".
	Program string
	// Token is the admin token (the admin API's); empty means the address
	// is loopback and nothing is asked.
	Token string
	// Gatherer is the process's metrics registry, sampled every
	// SampleEvery for the charts of the process's own counters. Optional.
	Gatherer prometheus.Gatherer
	// SampleEvery is the sampling period of Gatherer. Default 5s.
	SampleEvery time.Duration
	// DedupWindow is the consumer's dedup window (0: unknown).
	DedupWindow time.Duration
	// Broker reads the broker's retention settings. Optional.
	Broker func(ctx context.Context) (*BrokerSettings, error)
	// Logger receives request errors. Default: none.
	Logger *slog.Logger
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// Console serves the pages. Create it with New.
type Console struct {
	cfg     Config
	secret  []byte
	tokHash [32]byte
	static  http.Handler
	samples *sampler
	handler http.Handler
}

// Prefix is the path the console is served under.
const Prefix = "/console/"

// New checks cfg and returns a Console.
func New(cfg Config) (*Console, error) {
	if cfg.Databases.Names == nil {
		if cfg.Service == nil {
			return nil, errors.New("console: Config.Service (or Databases) is required")
		}
		cfg.Databases = admin.One("", cfg.Service)
	}
	if cfg.Program == "" {
		cfg.Program = "pgrelay"
	}
	if cfg.SampleEvery == 0 {
		cfg.SampleEvery = 5 * time.Second
	}
	if cfg.SampleEvery < 0 {
		return nil, fmt.Errorf("console: Config.SampleEvery must be positive, got %s", cfg.SampleEvery)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return nil, fmt.Errorf("console: secret: %w", err)
	}
	static, err := fs.Sub(assets, "static")
	if err != nil {
		return nil, err
	}
	c := &Console{cfg: cfg, secret: secret, tokHash: sha256.Sum256([]byte(cfg.Token)),
		static:  http.StripPrefix(Prefix+"static/", http.FileServerFS(static)),
		samples: newSampler(cfg.Gatherer, cfg.SampleEvery, time.Hour)}
	c.handler = c.routes()
	return c, nil
}

// Handler returns the console's handler, to be mounted at Prefix.
func (c *Console) Handler() http.Handler { return c.handler }

// Run samples the process's counters until ctx is cancelled.
func (c *Console) Run(ctx context.Context) error {
	if c.cfg.Gatherer == nil {
		return nil
	}
	c.samples.sample(c.cfg.Now())
	t := time.NewTicker(c.cfg.SampleEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			c.samples.sample(c.cfg.Now())
		}
	}
}

func (c *Console) routes() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET "+Prefix+"static/", c.static)
	mux.HandleFunc("GET "+Prefix+"login", c.loginPage)
	mux.HandleFunc("POST "+Prefix+"login", c.login)
	mux.HandleFunc("POST "+Prefix+"logout", c.logout)
	mux.HandleFunc("GET "+Prefix+"{$}", c.overview)
	mux.HandleFunc("GET "+Prefix+"dead", c.deadList)
	mux.HandleFunc("GET "+Prefix+"dead/{source}/{id}", c.deadDetail)
	mux.HandleFunc("GET "+Prefix+"ordered", c.ordered)
	mux.HandleFunc("GET "+Prefix+"conflicts", c.conflicts)
	mux.HandleFunc("GET "+Prefix+"relay", c.relay)
	mux.HandleFunc("GET "+Prefix+"audit", c.audit)
	mux.HandleFunc("POST "+Prefix+"act", c.act)
	return c.guard(c.pick(mux))
}

type serviceKey struct{}

// picked is the request's database: its name and Service.
type picked struct {
	name string
	svc  *admin.Service
}

// pick finds the database the request names (its database parameter, in
// the URL; none is the first) and refuses an unknown one, naming those
// served. The sign-in page and the stylesheet need none.
func (c *Console) pick(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == Prefix+"login" || r.URL.Path == Prefix+"logout" || strings.HasPrefix(r.URL.Path, Prefix+"static/") {
			next.ServeHTTP(w, r)
			return
		}
		name := r.URL.Query().Get("database")
		if names := c.cfg.Databases.Names(); name == "" && len(names) > 0 {
			name = names[0]
		}
		s, err := c.cfg.Databases.Pick(name)
		if err != nil {
			c.fail(w, r, err)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), serviceKey{}, picked{name, s})))
	})
}

// svc is the Service of the request's database (pick).
func svc(ctx context.Context) *admin.Service { return ctx.Value(serviceKey{}).(picked).svc }

// database is the name of the request's database (pick).
func database(ctx context.Context) string { return ctx.Value(serviceKey{}).(picked).name }

// guard applies the token rules, the Host check and the POST checks, and
// recovers from panics.
func (c *Console) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				c.cfg.Logger.Error("console handler panicked", slog.Any("panic", v), slog.String("path", r.URL.Path))
				http.Error(w, "internal error", http.StatusInternalServerError)
			}
		}()
		w.Header().Set("X-Frame-Options", "DENY")
		w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'")
		w.Header().Set("Referrer-Policy", "same-origin")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		if c.cfg.Token == "" && !admin.LoopbackHost(r.Host) {
			// Only a loopback address serves without a token; a browser that
			// names another host here reached it by DNS rebinding.
			c.refuse(w, r, http.StatusMisdirectedRequest, "this console answers only to a loopback host name (127.0.0.1, ::1 or localhost)")
			return
		}
		isLogin := r.URL.Path == Prefix+"login" || strings.HasPrefix(r.URL.Path, Prefix+"static/")
		if !isLogin && !c.authenticated(r) {
			if r.Method == http.MethodGet || r.Method == http.MethodHead {
				http.Redirect(w, r, Prefix+"login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
				return
			}
			w.Header().Set("WWW-Authenticate", `Bearer realm="pgrelay-admin"`)
			c.refuse(w, r, http.StatusUnauthorized, "refused: the admin token is required (sign in with it, or send it as a bearer token)")
			return
		}
		if r.Method == http.MethodPost {
			if msg := c.checkPost(r); msg != "" {
				c.refuse(w, r, http.StatusForbidden, msg)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

const sessionCookie = "pgrelay_console"

func (c *Console) mac(parts ...string) string {
	m := hmac.New(sha256.New, c.secret)
	for _, p := range parts {
		fmt.Fprintf(m, "%d:%s;", len(p), p)
	}
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// session is the cookie value a sign-in with the right token sets: valid
// for this process only (its secret), and revealing nothing of the token.
func (c *Console) session() string { return c.mac("session", string(c.tokHash[:])) }

func (c *Console) authenticated(r *http.Request) bool {
	if c.cfg.Token == "" {
		return true
	}
	if got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		h := sha256.Sum256([]byte(got))
		return subtle.ConstantTimeCompare(h[:], c.tokHash[:]) == 1
	}
	if ck, err := r.Cookie(sessionCookie); err == nil {
		return subtle.ConstantTimeCompare([]byte(ck.Value), []byte(c.session())) == 1
	}
	return false
}

// csrf is the token every form carries.
func (c *Console) csrf() string { return c.mac("csrf", string(c.tokHash[:])) }

// checkPost returns why a POST is refused, or "".
func (c *Console) checkPost(r *http.Request) string {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		return "refused: cross-site request (Sec-Fetch-Site: " + site + ")"
	}
	if o := r.Header.Get("Origin"); o != "" && o != "null" {
		u, err := url.Parse(o)
		if err != nil || u.Host != r.Host {
			return "refused: the request's Origin " + o + " is not this console's"
		}
	}
	if err := r.ParseForm(); err != nil {
		return "refused: bad form: " + err.Error()
	}
	if r.URL.Path == Prefix+"login" {
		return "" // the token itself is the proof
	}
	if subtle.ConstantTimeCompare([]byte(r.PostForm.Get("csrf")), []byte(c.csrf())) != 1 {
		return "refused: the form's CSRF token is missing or stale (reload the page)"
	}
	return ""
}

func (c *Console) refuse(w http.ResponseWriter, r *http.Request, status int, msg string) {
	c.render(w, r, status, "error", "Refused", show(errorPage, errorData{Status: status, Message: msg}))
}

type errorData struct {
	Status  int
	Message string
}

func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	next := r.URL.Query().Get("next")
	if c.cfg.Token == "" || c.authenticated(r) {
		http.Redirect(w, r, safeNext(next), http.StatusSeeOther)
		return
	}
	c.render(w, r, http.StatusOK, "login", "Sign in", show(loginPage, loginData{Next: next}))
}

type loginData struct {
	Next  string
	Error string
}

func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	next := r.PostForm.Get("next")
	if c.cfg.Token == "" {
		http.Redirect(w, r, safeNext(next), http.StatusSeeOther)
		return
	}
	h := sha256.Sum256([]byte(r.PostForm.Get("token")))
	if subtle.ConstantTimeCompare(h[:], c.tokHash[:]) != 1 {
		c.render(w, r, http.StatusUnauthorized, "login", "Sign in", show(loginPage, loginData{Next: next, Error: "wrong token"}))
		return
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: c.session(), Path: Prefix, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	http.Redirect(w, r, safeNext(next), http.StatusSeeOther)
}

func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: Prefix, MaxAge: -1, HttpOnly: true,
		SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, Prefix+"login", http.StatusSeeOther)
}

// safeNext keeps a post-sign-in redirect inside the console.
func safeNext(next string) string {
	if !strings.HasPrefix(next, Prefix) || strings.HasPrefix(next, "//") || strings.Contains(next, "\\") {
		return Prefix
	}
	return next
}
