package cli

import (
	"context"
	"fmt"
	"math"
	"net"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/pflag"
)

// DBSettings are the session settings of a service's database connections.
// They bound how long a hung or vanished process can hold rows locked: a
// server-side timeout ends a session idle inside a transaction (its locks go
// with it, so another worker can take its claims over), a statement timeout
// ends a runaway query, and TCP keepalives in both directions notice a peer
// that disappeared without closing its connection.
type DBSettings struct {
	// StatementTimeout is PostgreSQL's statement_timeout for every session.
	// Default: 1m. Zero disables it.
	StatementTimeout time.Duration
	// IdleInTransactionTimeout is PostgreSQL's
	// idle_in_transaction_session_timeout. Zero means the service's lease
	// (see Resolve), negative disables it.
	IdleInTransactionTimeout time.Duration
	// TCPKeepalive is the idle time before the first TCP keepalive probe, on
	// the client's socket and the server's (tcp_keepalives_idle); probes then
	// follow every third of it (at least 1s) and three unanswered ones end the
	// connection. Default: 30s. Zero disables pgrelay's setting (the operating
	// system's defaults apply).
	TCPKeepalive time.Duration
}

// Defaults for DBSettings.
const (
	DefaultStatementTimeout = time.Minute
	DefaultTCPKeepalive     = 30 * time.Second
	keepaliveProbes         = 3
)

// DBEnvKinds lists the DBSettings environment variables for ValidateEnv.
var DBEnvKinds = map[string]string{
	"DB_STATEMENT_TIMEOUT":           "duration",
	"DB_IDLE_IN_TRANSACTION_TIMEOUT": "duration",
	"DB_TCP_KEEPALIVE":               "duration",
}

// BindDBFlags registers the DBSettings flags, each defaulted from its
// environment variable. leaseFlag names the flag whose value an idle in
// transaction timeout of 0 takes.
func BindDBFlags(f *pflag.FlagSet, s *DBSettings, leaseFlag string) {
	f.DurationVar(&s.StatementTimeout, "db-statement-timeout", EnvDuration("DB_STATEMENT_TIMEOUT", DefaultStatementTimeout),
		"PostgreSQL statement_timeout of every connection; 0 disables (env DB_STATEMENT_TIMEOUT)")
	f.DurationVar(&s.IdleInTransactionTimeout, "db-idle-in-transaction-timeout", EnvDuration("DB_IDLE_IN_TRANSACTION_TIMEOUT", 0),
		"PostgreSQL ends a session idle inside a transaction this long, releasing its locks; 0 = the "+leaseFlag+", negative disables (env DB_IDLE_IN_TRANSACTION_TIMEOUT)")
	f.DurationVar(&s.TCPKeepalive, "db-tcp-keepalive", EnvDuration("DB_TCP_KEEPALIVE", DefaultTCPKeepalive),
		"idle time before TCP keepalive probes on database connections, client and server side; 0 leaves the system defaults (env DB_TCP_KEEPALIVE)")
}

// Resolve returns s with IdleInTransactionTimeout 0 replaced by defaultIdle
// (the lease), then validates it: minIdle is the shortest idle in transaction
// timeout that cannot cut a healthy transaction short (the handler timeout,
// for the inbox), 0 for none; the lease itself is checked against it by the
// service's own validation. Errors name the flag and environment variable.
func (s DBSettings) Resolve(defaultIdle, minIdle time.Duration) (DBSettings, error) {
	explicit := s.IdleInTransactionTimeout != 0
	if !explicit {
		s.IdleInTransactionTimeout = defaultIdle
	}
	if err := checkMillis("--db-statement-timeout (DB_STATEMENT_TIMEOUT)", s.StatementTimeout); err != nil {
		return s, err
	}
	if s.IdleInTransactionTimeout > 0 {
		if err := checkMillis("--db-idle-in-transaction-timeout (DB_IDLE_IN_TRANSACTION_TIMEOUT)", s.IdleInTransactionTimeout); err != nil {
			return s, err
		}
		if explicit && s.IdleInTransactionTimeout <= minIdle {
			return s, fmt.Errorf("--db-idle-in-transaction-timeout (DB_IDLE_IN_TRANSACTION_TIMEOUT) must exceed the handler timeout %s (a handler's transaction is idle while it works), got %s",
				minIdle, s.IdleInTransactionTimeout)
		}
	}
	if s.TCPKeepalive < 0 || (s.TCPKeepalive > 0 && s.TCPKeepalive < time.Second) || s.TCPKeepalive > time.Duration(math.MaxInt32)*time.Second {
		return s, fmt.Errorf("--db-tcp-keepalive (DB_TCP_KEEPALIVE) must be 0 (system defaults) or at least 1s, got %s", s.TCPKeepalive)
	}
	return s, nil
}

// checkMillis accepts 0 or a whole number of milliseconds PostgreSQL can store.
func checkMillis(name string, d time.Duration) error {
	switch {
	case d < 0:
		return fmt.Errorf("%s must not be negative (0 disables), got %s", name, d)
	case d > 0 && d < time.Millisecond:
		return fmt.Errorf("%s must be at least 1ms (0 disables), got %s", name, d)
	case d > time.Duration(math.MaxInt32)*time.Millisecond:
		return fmt.Errorf("%s must be at most %s, got %s", name, time.Duration(math.MaxInt32)*time.Millisecond, d)
	}
	return nil
}

// Apply sets s on a pool configuration: the session parameters go into the
// start-up message of every connection, the keepalive into its dialer. A
// parameter the connection string already sets (?statement_timeout=0, say)
// is left as given. s must have been resolved.
func (s DBSettings) Apply(cfg *pgxpool.Config) {
	params := cfg.ConnConfig.RuntimeParams
	set := func(name, value string) {
		if _, given := params[name]; !given {
			params[name] = value
		}
	}
	set("statement_timeout", strconv.FormatInt(s.StatementTimeout.Milliseconds(), 10))
	idle := max(s.IdleInTransactionTimeout, 0)
	set("idle_in_transaction_session_timeout", strconv.FormatInt(idle.Milliseconds(), 10))
	if s.TCPKeepalive > 0 {
		interval := max(s.TCPKeepalive/3, time.Second)
		set("tcp_keepalives_idle", strconv.Itoa(int(s.TCPKeepalive/time.Second)))
		set("tcp_keepalives_interval", strconv.Itoa(int(interval/time.Second)))
		set("tcp_keepalives_count", strconv.Itoa(keepaliveProbes))
		d := &net.Dialer{KeepAliveConfig: net.KeepAliveConfig{
			Enable: true, Idle: s.TCPKeepalive, Interval: interval, Count: keepaliveProbes,
		}}
		cfg.ConnConfig.DialFunc = d.DialContext
	}
}

// OpenPool connects a service's pool to databaseURL with the session settings
// s (already resolved). minConns raises the pool's size when the URL's
// pool_max_conns is smaller. Errors name --database-url.
func OpenPool(ctx context.Context, databaseURL string, s DBSettings, minConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("--database-url (DATABASE_URL): %w", err)
	}
	if cfg.MaxConns < minConns {
		cfg.MaxConns = minConns
	}
	s.Apply(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("--database-url (DATABASE_URL): %w", err)
	}
	return pool, nil
}
