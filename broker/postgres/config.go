// Package postgres is pgrelay's PostgreSQL "broker": a broker.Publisher whose
// Publish stores each batch straight into the inbox of a target database
// (the relay's own or another one, on the same server or elsewhere), in one
// transaction, through the very receive path a consumer uses
// (deduplication by each handler's key, key sequences for ordered apply,
// dead rows for keys that cannot be built). There is no subscriber: the
// consumer of the target database runs its inbox workers only
// (consumer.Config.Direct, consumer --broker postgres), woken by the
// NOTIFY the publisher sends with each batch.
//
// Which handlers an event is stored for is read, in the transaction of every
// batch, from the target's pgrelay.inbox_subscriptions, which a direct
// consumer fills at start-up (Register). See docs/postgres-broker.md.
package postgres

import (
	"errors"
	"log/slog"
	"net/url"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/internal/setting"
)

// DefaultMaxMessageBytes is the default Config.MaxMessageBytes: 1 MiB, the
// payload limit a command-line consumer gives its subscriber.
const DefaultMaxMessageBytes = 1 << 20

// DefaultMaxConns is the default Config.MaxConns: one per partition of a
// default install (16), each of which may store a batch at once; the pool
// opens connections only as needed.
const DefaultMaxConns = 16

// Config configures the publisher.
type Config struct {
	// URL is the target database (postgres://...), migrated with pgrelay's
	// migrations, whose inbox the events are stored in. Required unless
	// Pool is set.
	URL string
	// Pool, when set, is used instead of dialling URL (the publisher does
	// not close it): a relay delivering into its own database may share
	// its pool.
	Pool *pgxpool.Pool
	// MaxConns bounds the connections the publisher opens to URL (one per
	// batch being stored). Default DefaultMaxConns.
	MaxConns int32
	// MaxMessageBytes is the largest payload stored; a larger one is refused
	// as a permanent error (the relay dead-letters it). Default
	// DefaultMaxMessageBytes.
	MaxMessageBytes int
	// Logger receives the publisher's logs. Default: none.
	Logger *slog.Logger
}

// WithDefaults returns the config with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.MaxConns == 0 {
		c.MaxConns = DefaultMaxConns
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	return c
}

// Validate reports every invalid setting, each a *setting.FieldError naming
// "postgres.Config.<Field>".
func (c Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, setting.Errorf("", "postgres.Config", field, format, args...))
	}
	if c.Pool == nil {
		if c.URL == "" {
			bad("URL", "{} is required (the target database)")
		} else if _, err := pgxpool.ParseConfig(c.URL); err != nil {
			bad("URL", "{} %s: %v", RedactURL(c.URL), errors.Unwrap(err))
		}
	}
	if c.MaxConns < 1 {
		bad("MaxConns", "{} %d must be at least 1", c.MaxConns)
	}
	if c.MaxMessageBytes < 1 {
		bad("MaxMessageBytes", "{} %d must be at least 1", c.MaxMessageBytes)
	}
	return errors.Join(errs...)
}

// RedactURL hides the password of a connection URL, for logs and errors.
func RedactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" {
		return "(unparsable URL)"
	}
	return u.Redacted()
}
