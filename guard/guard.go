// Package guard protects effects outside the database (an email, a payment
// provider call, a scheduled job's run) from happening twice: Reserve a key
// before the effect, Confirm it after, Release it when the effect failed and
// may be retried.
//
// A guard narrows the window, it cannot close it: a process that crashes
// after the effect and before Confirm leaves a reservation that expires at
// the end of its lease, after which the key can be reserved again and the
// effect repeated. Pass the key to the outside system too when it supports
// idempotency keys; see docs/idempotency.md.
package guard

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgrelay/pgrelay/internal/wait"
)

// Errors returned by Reserve and the Reservation methods.
var (
	// ErrDuplicate: the key's effect was already confirmed.
	ErrDuplicate = errors.New("guard: effect already confirmed for this key")
	// ErrInProgress: another holder reserved the key and its lease is live.
	ErrInProgress = errors.New("guard: key reserved by another holder")
	// ErrLeaseLost: the reservation is no longer this holder's (its lease
	// ran out and the key was taken or cleaned).
	ErrLeaseLost = errors.New("guard: reservation no longer held")
	// ErrUnavailable: the store could not be asked (fail closed).
	ErrUnavailable = errors.New("guard: store unavailable")
	// ErrInvalidKey: the key is empty, longer than MaxKeyLength, not valid
	// UTF-8 or holds a NUL byte. No store is asked and FailOpen does not
	// apply: retrying the same key can never succeed.
	ErrInvalidKey = errors.New("guard: invalid key")
)

// State is the outcome of a store's Reserve.
type State int

// Reserve outcomes.
const (
	Acquired   State = iota // the key is now held by the caller's token
	InProgress              // another token holds a live lease
	Done                    // the effect was confirmed
)

// Stats are a store's size figures; a negative value is unknown.
type Stats struct {
	ActiveKeys   int64
	StorageBytes int64
}

// Store keeps reservations. PostgresStore and RedisStore implement it; any
// error other than ErrLeaseLost means the store is unavailable.
type Store interface {
	// Name labels the store in metrics and logs.
	Name() string
	// Reserve takes key for token for ttl when it is free or expired.
	Reserve(ctx context.Context, key, token string, ttl time.Duration) (State, error)
	// Confirm marks token's reservation of key done and keeps it for keep.
	Confirm(ctx context.Context, key, token string, keep time.Duration) error
	// Extend renews token's lease of key to ttl from now.
	Extend(ctx context.Context, key, token string, ttl time.Duration) error
	// Release frees token's reservation of key.
	Release(ctx context.Context, key, token string) error
	// Stats reports the live keys and storage size, where cheap.
	Stats(ctx context.Context) (Stats, error)
}

// Config configures a Guard.
type Config struct {
	// Store keeps the reservations. Default: a PostgresStore on Pool.
	Store Store
	// Pool is the database of the default store (table guard_keys).
	// Required when Store is nil.
	Pool *pgxpool.Pool
	// ConfirmedTTL is how long a confirmed key refuses repeats.
	// Default: 24h.
	ConfirmedTTL time.Duration
	// MaxKeyLength bounds keys, in bytes. Default: 512. Keys must also be
	// valid UTF-8 without NUL bytes (ValidateKey).
	MaxKeyLength int
	// FailOpen lets Reserve proceed, unguarded, when the store cannot be
	// asked: the effect may then happen twice. Every such call is logged at
	// error level and counted. Default: false (fail closed: ErrUnavailable).
	FailOpen bool
	// Timeout bounds each store call. Default: 2s.
	Timeout time.Duration
	// Logger receives store failures and fail-open decisions.
	// Default: a no-op logger.
	Logger *slog.Logger
	// Registerer receives the guard's metrics. Default: none registered.
	Registerer prometheus.Registerer
}

// WithDefaults returns a copy of c with every unset field at its default.
func (c Config) WithDefaults() Config {
	if c.Store == nil && c.Pool != nil {
		c.Store = NewPostgresStore(c.Pool)
	}
	if c.ConfirmedTTL == 0 {
		c.ConfirmedTTL = 24 * time.Hour
	}
	if c.MaxKeyLength == 0 {
		c.MaxKeyLength = 512
	}
	if c.Timeout == 0 {
		c.Timeout = 2 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.Store == nil:
		return errors.New("guard: Store or Pool is required")
	case c.ConfirmedTTL < time.Millisecond:
		return fmt.Errorf("guard: ConfirmedTTL must be at least 1ms, got %s", c.ConfirmedTTL)
	case c.MaxKeyLength < 1 || c.MaxKeyLength > 512:
		return fmt.Errorf("guard: MaxKeyLength must be 1..512, got %d", c.MaxKeyLength)
	case c.Timeout <= 0:
		return fmt.Errorf("guard: Timeout must be positive, got %s", c.Timeout)
	}
	return nil
}

// Guard reserves keys in a Store, with metrics. It is safe for concurrent
// use.
type Guard struct {
	cfg Config
	m   *metrics
}

// New returns a Guard, or an error naming the invalid Config field (or a
// metrics registration failure).
func New(cfg Config) (*Guard, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	g := &Guard{cfg: cfg}
	g.m = newMetrics(g)
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(g.m); err != nil {
			return nil, fmt.Errorf("guard: register metrics: %w", err)
		}
	}
	return g, nil
}

// Reservation is a held key. Exactly one of Confirm or Release should end it.
type Reservation struct {
	g     *Guard
	key   string
	token string
	// Unguarded is true when the store was unavailable and FailOpen let the
	// caller through: nothing is held, and Confirm, Extend and Release do
	// nothing.
	Unguarded bool
}

// Key returns the reserved key.
func (r *Reservation) Key() string { return r.key }

// ValidateKey checks a key against the rule every store shares: 1 to
// maxLen bytes of valid UTF-8 without a NUL byte (PostgreSQL text can hold
// nothing else; the Redis store, which could, refuses the same keys so that
// switching stores never changes which keys work). The error wraps
// ErrInvalidKey.
func ValidateKey(key string, maxLen int) error {
	switch {
	case key == "" || len(key) > maxLen:
		return fmt.Errorf("%w: a key must be 1..%d bytes, got %d", ErrInvalidKey, maxLen, len(key))
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: %q is not valid UTF-8", ErrInvalidKey, key)
	case strings.IndexByte(key, 0) >= 0:
		return fmt.Errorf("%w: %q contains a NUL byte", ErrInvalidKey, key)
	}
	return nil
}

// Reserve takes key for a lease of ttl before an effect. It returns
// ErrInvalidKey when the key breaks ValidateKey's rule (whatever FailOpen
// says: the store is not asked), ErrDuplicate when the key's effect was
// confirmed, ErrInProgress when another holder's lease is live, and
// ErrUnavailable when the store cannot be asked (unless FailOpen). Choose ttl longer than the effect takes, or Extend
// the lease while it runs: a lease that ends lets a second holder in.
func (g *Guard) Reserve(ctx context.Context, key string, ttl time.Duration) (*Reservation, error) {
	if err := ValidateKey(key, g.cfg.MaxKeyLength); err != nil {
		return nil, err
	}
	if ttl < time.Millisecond {
		return nil, fmt.Errorf("guard: ttl must be at least 1ms, got %s", ttl)
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	token := hex.EncodeToString(b[:])
	g.m.ttl.Observe(ttl.Seconds())
	qctx, cancel := context.WithTimeout(ctx, g.cfg.Timeout)
	start := time.Now()
	st, err := g.cfg.Store.Reserve(qctx, key, token, ttl)
	cancel()
	g.m.latency.Observe(time.Since(start).Seconds())
	if err != nil {
		g.m.check("unavailable")
		if g.cfg.FailOpen {
			g.m.failOpen.Inc()
			g.cfg.Logger.Error("guard: STORE UNAVAILABLE, FAILING OPEN: the effect runs unguarded and may happen twice",
				slog.String("store", g.cfg.Store.Name()), slog.String("key", key), slog.Any("error", err))
			return &Reservation{g: g, key: key, token: token, Unguarded: true}, nil
		}
		g.cfg.Logger.Warn("guard: store unavailable, refusing the effect (fail closed)",
			slog.String("store", g.cfg.Store.Name()), slog.String("key", key), slog.Any("error", err))
		return nil, fmt.Errorf("%w: %s: %w", ErrUnavailable, g.cfg.Store.Name(), err)
	}
	switch st {
	case Acquired:
		g.m.check("reserved")
		return &Reservation{g: g, key: key, token: token}, nil
	case Done:
		g.m.check("duplicate")
		return nil, ErrDuplicate
	default:
		g.m.check("in_progress")
		return nil, ErrInProgress
	}
}

func (g *Guard) call(ctx context.Context, f func(context.Context) error) error {
	qctx, cancel := context.WithTimeout(ctx, g.cfg.Timeout)
	defer cancel()
	err := f(qctx)
	if err != nil && !errors.Is(err, ErrLeaseLost) {
		return fmt.Errorf("%w: %s: %w", ErrUnavailable, g.cfg.Store.Name(), err)
	}
	return err
}

// Confirm records that the effect happened: the key refuses repeats for
// ConfirmedTTL. ErrLeaseLost means another holder took the key after this
// lease ended: the effect may have happened twice.
func (r *Reservation) Confirm(ctx context.Context) error {
	if r.Unguarded {
		return nil
	}
	return r.g.call(ctx, func(ctx context.Context) error {
		return r.g.cfg.Store.Confirm(ctx, r.key, r.token, r.g.cfg.ConfirmedTTL)
	})
}

// Release frees the key after a failed effect, so that a retry may run it.
func (r *Reservation) Release(ctx context.Context) error {
	if r.Unguarded {
		return nil
	}
	return r.g.call(ctx, func(ctx context.Context) error { return r.g.cfg.Store.Release(ctx, r.key, r.token) })
}

// Extend renews the lease to ttl from now, for an effect that runs longer
// than its first lease. ErrLeaseLost means the lease had already ended and
// the key was taken or cleaned.
func (r *Reservation) Extend(ctx context.Context, ttl time.Duration) error {
	if r.Unguarded {
		return nil
	}
	r.g.m.ttl.Observe(ttl.Seconds())
	return r.g.call(ctx, func(ctx context.Context) error { return r.g.cfg.Store.Extend(ctx, r.key, r.token, ttl) })
}

// KeepAlive extends the lease to ttl every ttl/3 until stop is called or
// ctx ends; stop returns the first Extend error, if any. Use it around an
// effect whose duration is unknown.
func (r *Reservation) KeepAlive(ctx context.Context, ttl time.Duration) (stop func() error) {
	ctx, cancel := context.WithCancel(ctx)
	var (
		wg    sync.WaitGroup
		first error
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		err := wait.Tick(ctx, max(ttl/3, time.Millisecond), func() error { return r.Extend(ctx, ttl) })
		if err != nil && ctx.Err() == nil {
			first = err
		}
	}()
	return func() error {
		cancel()
		wg.Wait()
		return first
	}
}

// Checks returns how many Reserve calls were made and how many were refused
// as duplicates (confirmed or in progress), since the Guard was made.
func (g *Guard) Checks() (checks, duplicates int64) {
	return g.m.checks.Load(), g.m.dups.Load()
}

type metrics struct {
	g        *Guard
	checks   atomic.Int64
	dups     atomic.Int64
	results  *prometheus.CounterVec
	dupTotal prometheus.Counter
	failOpen prometheus.Counter
	latency  prometheus.Histogram
	ttl      prometheus.Histogram
	hitRatio *prometheus.Desc
	active   *prometheus.Desc
	bytes    *prometheus.Desc
}

func newMetrics(g *Guard) *metrics {
	l := prometheus.Labels{"store": g.cfg.Store.Name()}
	return &metrics{
		g: g,
		results: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pgrelay_guard_checks_total",
			Help: "Reserve calls by result: reserved, duplicate, in_progress, unavailable.", ConstLabels: l}, []string{"result"}),
		dupTotal: prometheus.NewCounter(prometheus.CounterOpts{Name: "pgrelay_guard_duplicates_total",
			Help: "Reserve calls refused because the key was confirmed or held.", ConstLabels: l}),
		failOpen: prometheus.NewCounter(prometheus.CounterOpts{Name: "pgrelay_guard_fail_open_total",
			Help: "Reserve calls let through unguarded because the store was unavailable.", ConstLabels: l}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "pgrelay_guard_check_duration_seconds",
			Help: "Latency of the store's Reserve.", ConstLabels: l,
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1}}),
		ttl: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "pgrelay_guard_lease_ttl_seconds",
			Help: "Lease TTLs asked for by Reserve and Extend.", ConstLabels: l,
			Buckets: prometheus.ExponentialBuckets(0.1, 4, 10)}),
		hitRatio: prometheus.NewDesc("pgrelay_guard_hit_ratio", "Share of Reserve calls refused as duplicates.", nil, l),
		active:   prometheus.NewDesc("pgrelay_guard_active_keys", "Keys reserved or confirmed and not expired.", nil, l),
		bytes:    prometheus.NewDesc("pgrelay_guard_storage_bytes", "Storage used by the guard's keys, where cheap to know.", nil, l),
	}
}

func (m *metrics) check(result string) {
	m.results.WithLabelValues(result).Inc()
	m.checks.Add(1)
	if result == "duplicate" || result == "in_progress" {
		m.dups.Add(1)
		m.dupTotal.Inc()
	}
}

func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	m.results.Describe(ch)
	m.dupTotal.Describe(ch)
	m.failOpen.Describe(ch)
	m.latency.Describe(ch)
	m.ttl.Describe(ch)
	ch <- m.hitRatio
	ch <- m.active
	ch <- m.bytes
}

func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	m.results.Collect(ch)
	m.dupTotal.Collect(ch)
	m.failOpen.Collect(ch)
	m.latency.Collect(ch)
	m.ttl.Collect(ch)
	ratio := 0.0
	if c := m.checks.Load(); c > 0 {
		ratio = float64(m.dups.Load()) / float64(c)
	}
	ch <- prometheus.MustNewConstMetric(m.hitRatio, prometheus.GaugeValue, ratio)
	ctx, cancel := context.WithTimeout(context.Background(), m.g.cfg.Timeout)
	defer cancel()
	st, err := m.g.cfg.Store.Stats(ctx)
	if err != nil {
		m.g.cfg.Logger.Warn("guard: stats", slog.String("store", m.g.cfg.Store.Name()), slog.Any("error", err))
		return
	}
	if st.ActiveKeys >= 0 {
		ch <- prometheus.MustNewConstMetric(m.active, prometheus.GaugeValue, float64(st.ActiveKeys))
	}
	if st.StorageBytes >= 0 {
		ch <- prometheus.MustNewConstMetric(m.bytes, prometheus.GaugeValue, float64(st.StorageBytes))
	}
}
