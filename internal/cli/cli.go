// Package cli holds what the relay and consumer binaries share: settings read
// from flags and the environment, logging, signal handling and the migrate
// subcommand.
package cli

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/pgrelay/pgrelay/internal/zapslog"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// EnvString returns the environment variable name, or def when it is unset.
// Flags use it for their defaults, so every setting can come from either.
func EnvString(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

// EnvInt is EnvString for integers. A malformed value is reported by
// ValidateEnv, not here, so that flag set-up never fails.
func EnvInt(name string, def int) int {
	if v, ok := os.LookupEnv(name); ok {
		if n, err := strconv.Atoi(v); err == nil {
			return n
		}
	}
	return def
}

// EnvDuration is EnvString for durations (Go syntax: 500ms, 30s, 5m).
func EnvDuration(name string, def time.Duration) time.Duration {
	if v, ok := os.LookupEnv(name); ok {
		if d, err := time.ParseDuration(v); err == nil {
			return d
		}
	}
	return def
}

// EnvBool is EnvString for booleans.
func EnvBool(name string, def bool) bool {
	if v, ok := os.LookupEnv(name); ok {
		if b, err := strconv.ParseBool(v); err == nil {
			return b
		}
	}
	return def
}

// EnvFloat is EnvString for numbers.
func EnvFloat(name string, def float64) float64 {
	if v, ok := os.LookupEnv(name); ok {
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			return f
		}
	}
	return def
}

// ValidateEnv checks that each named environment variable, when set, parses as
// its kind ("int", "number", "duration" or "bool"), and names the first one that does not.
func ValidateEnv(kinds map[string]string) error {
	for name, kind := range kinds {
		v, ok := os.LookupEnv(name)
		if !ok {
			continue
		}
		var err error
		switch kind {
		case "int":
			_, err = strconv.Atoi(v)
		case "number":
			_, err = strconv.ParseFloat(v, 64)
		case "duration":
			_, err = time.ParseDuration(v)
		case "bool":
			_, err = strconv.ParseBool(v)
		}
		if err != nil {
			return fmt.Errorf("invalid %s=%q: want a %s", name, v, kind)
		}
	}
	return nil
}

// NewLogger builds the commands' logger: zap, seen as a *slog.Logger. level is debug, info, warn or error; format is
// json or console.
func NewLogger(level, format string) (*slog.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("invalid log level %q (--log-level / LOG_LEVEL): want debug, info, warn or error", level)
	}
	var cfg zap.Config
	switch format {
	case "json":
		cfg = zap.NewProductionConfig()
	case "console":
		cfg = zap.NewDevelopmentConfig()
		cfg.Development = false
	default:
		return nil, fmt.Errorf("invalid log format %q (--log-format / LOG_FORMAT): want json or console", format)
	}
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	cfg.Sampling = nil
	cfg.DisableStacktrace = true
	z, err := cfg.Build()
	if err != nil {
		return nil, err
	}
	return zapslog.New(z), nil
}

// SignalContext returns a context cancelled on SIGTERM or SIGINT, which is how
// the services learn to shut down gracefully.
func SignalContext(parent context.Context) (context.Context, context.CancelFunc) {
	return signal.NotifyContext(parent, syscall.SIGTERM, syscall.SIGINT)
}
