package pgrelay

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/pgrelay/pgrelay/internal/setting"
)

// Defaults for InboxConfig.
const (
	DefaultWorkers         = 4
	DefaultBatchSize       = 50
	MaxBatchSize           = 10000
	DefaultLease           = 30 * time.Second
	DefaultHandlerTimeout  = 10 * time.Second
	DefaultMaxAttempts     = 10
	DefaultBackoffMin      = time.Second
	DefaultBackoffMax      = 5 * time.Minute
	defaultMaxDeferrals    = 20
	defaultDeferFallback   = time.Minute
	DefaultPollInterval    = time.Second
	defaultQueryTimeout    = 10 * time.Second
	defaultShutdownTimeout = 10 * time.Second
	DefaultGapTimeout      = 5 * time.Minute
)

// withDefaults returns a copy of c with every zero field set to its default.
func (c InboxConfig) withDefaults() InboxConfig {
	if c.Observer == nil {
		c.Observer = nopObserver{}
	}
	if c.WorkerID == "" {
		c.WorkerID = defaultWorkerID()
	}
	if c.HandlerName == "" {
		c.HandlerName = DefaultHandlerName
	}
	setDefault(&c.Workers, DefaultWorkers)
	setDefault(&c.BatchSize, DefaultBatchSize)
	setDefault(&c.Lease, DefaultLease)
	setDefault(&c.HandlerTimeout, DefaultHandlerTimeout)
	setDefault(&c.MaxAttempts, DefaultMaxAttempts)
	setDefault(&c.BackoffMin, DefaultBackoffMin)
	setDefault(&c.BackoffMax, DefaultBackoffMax)
	setDefault(&c.MaxDeferrals, defaultMaxDeferrals)
	setDefault(&c.DeferFallback, defaultDeferFallback)
	setDefault(&c.PollInterval, DefaultPollInterval)
	setDefault(&c.QueryTimeout, defaultQueryTimeout)
	setDefault(&c.ShutdownTimeout, defaultShutdownTimeout)
	setDefault(&c.Retention.ReleaseHorizon, releaseHorizon(c.Lease))
	c.Retention = c.Retention.withDefaults()
	setDefault(&c.GapTimeout, DefaultGapTimeout)
	return c
}

func setDefault[T int | time.Duration](p *T, def T) {
	if *p == 0 {
		*p = def
	}
}

// validate checks an InboxConfig that withDefaults has filled; each error is a
// *setting.FieldError naming the field.
func (c InboxConfig) validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, setting.Errorf("inbox", "InboxConfig", field, "{} "+format, args...))
	}
	if c.Pool == nil {
		bad("Pool", "is required")
	}
	if c.Handler == nil {
		bad("Handler", "is required")
	}
	if err := ValidateHandlerName(c.HandlerName); err != nil {
		bad("HandlerName", "%v", err)
	}
	if len(c.WorkerID) > 200 {
		bad("WorkerID", "is longer than 200 bytes")
	}
	if c.Workers < 1 || c.Workers > 1000 {
		bad("Workers", "must be between 1 and 1000, got %d", c.Workers)
	}
	if c.BatchSize < 1 || c.BatchSize > MaxBatchSize {
		bad("BatchSize", "must be between 1 and %d, got %d", MaxBatchSize, c.BatchSize)
	}
	positive := map[string]time.Duration{
		"Lease": c.Lease, "HandlerTimeout": c.HandlerTimeout, "BackoffMin": c.BackoffMin,
		"BackoffMax": c.BackoffMax, "DeferFallback": c.DeferFallback, "PollInterval": c.PollInterval,
		"QueryTimeout": c.QueryTimeout, "ShutdownTimeout": c.ShutdownTimeout, "GapTimeout": c.GapTimeout,
	}
	for _, name := range []string{"Lease", "HandlerTimeout", "BackoffMin", "BackoffMax", "DeferFallback",
		"PollInterval", "QueryTimeout", "ShutdownTimeout", "GapTimeout"} {
		if positive[name] < 0 {
			bad(name, "must be positive, got %s", positive[name])
		}
	}
	if c.HandlerTimeout >= c.Lease {
		bad("HandlerTimeout", "(%s) must be shorter than {Lease} (%s)", c.HandlerTimeout, c.Lease)
	}
	if c.BackoffMax < c.BackoffMin {
		bad("BackoffMax", "(%s) must not be below {BackoffMin} (%s)", c.BackoffMax, c.BackoffMin)
	}
	if c.MaxAttempts < 1 {
		bad("MaxAttempts", "must be at least 1, got %d", c.MaxAttempts)
	}
	if c.MaxDeferrals < 1 {
		bad("MaxDeferrals", "must be at least 1, got %d", c.MaxDeferrals)
	}
	if !c.Retention.Disabled {
		errs = append(errs, c.Retention.validate())
	}
	return errors.Join(errs...)
}

func (c InboxConfig) policy() policy {
	return policy{
		maxAttempts: c.MaxAttempts, maxDeferrals: c.MaxDeferrals,
		backoffMin: c.BackoffMin, backoffMax: c.BackoffMax, deferFallback: c.DeferFallback,
	}
}

// loggerOr returns l, or a logger that discards everything when l is nil.
func loggerOr(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}

func defaultWorkerID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}
