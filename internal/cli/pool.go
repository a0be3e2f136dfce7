package cli

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/pflag"

	"github.com/pgrelay/pgrelay/internal/pgurl"
	"github.com/pgrelay/pgrelay/internal/pooler"
	"github.com/pgrelay/pgrelay/migrations"
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
	// Pooler is how the connections reach PostgreSQL: straight (none, the
	// default), or through a connection pooler such as PgBouncer in session
	// or transaction mode. See docs/pooler.md.
	Pooler pooler.Mode
	// ListenURL, when set, is a direct connection to PostgreSQL for LISTEN
	// (the wake-ups), for a pool behind a pooler in transaction mode, where
	// LISTEN does not work. Empty: LISTEN on the pool's own connection
	// settings, or, in transaction mode, no LISTEN (the services poll).
	ListenURL string
}

// Defaults for DBSettings.
const (
	DefaultStatementTimeout = time.Minute
	DefaultTCPKeepalive     = 30 * time.Second
	keepaliveProbes         = 3
)

// PoolerFlag names --pooler and its environment variable.
const PoolerFlag = "--pooler (DB_POOLER)"

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
	f.Var(&poolerFlag{&s.Pooler}, "pooler", "a connection pooler between the service and PostgreSQL: none, session or transaction (its pool mode); see docs/pooler.md (env DB_POOLER)")
	f.StringVar(&s.ListenURL, "listen-url", os.Getenv("DB_LISTEN_URL"),
		"with --pooler transaction: a direct PostgreSQL URL for LISTEN wake-ups; empty polls instead (env DB_LISTEN_URL)")
}

// poolerFlag is --pooler, defaulted from DB_POOLER.
type poolerFlag struct{ m *pooler.Mode }

func (f *poolerFlag) String() string {
	if f.m == nil || *f.m == "" {
		return string(pooler.None)
	}
	return string(*f.m)
}
func (f *poolerFlag) Set(v string) error {
	m, err := pooler.Parse(v)
	if err != nil {
		return err
	}
	*f.m = m
	return nil
}
func (f *poolerFlag) Type() string { return "mode" }

// Resolve returns s with IdleInTransactionTimeout 0 replaced by defaultIdle
// (the lease), then validates it: minIdle is the shortest idle in transaction
// timeout that cannot cut a healthy transaction short (the handler timeout,
// for the inbox), 0 for none; the lease itself is checked against it by the
// service's own validation. Errors name the flag and environment variable.
func (s DBSettings) Resolve(defaultIdle, minIdle time.Duration) (DBSettings, error) {
	if s.Pooler == "" {
		m, err := pooler.Parse(os.Getenv("DB_POOLER"))
		if err != nil {
			return s, fmt.Errorf("%s %w", PoolerFlag, err)
		}
		s.Pooler = m
	}
	if s.ListenURL != "" {
		if s.Pooler != pooler.Transaction {
			return s, fmt.Errorf("--listen-url (DB_LISTEN_URL) is for --pooler transaction (LISTEN works on the pool's own connections otherwise), got --pooler %s", s.Pooler)
		}
		if _, err := pgurl.Parse(s.ListenURL); err != nil {
			return s, fmt.Errorf("--listen-url (DB_LISTEN_URL): %w", err)
		}
	}
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

// Apply sets s on a pool configuration. Straight to PostgreSQL (Pooler
// none), the session parameters go into the start-up message of every
// connection; behind a pooler in session mode, which refuses them there, a
// SET after connecting sets them; in transaction mode nothing is set in the
// session (the timeouts are the role's: see docs/pooler.md) and statements
// are described, not prepared under a name, so that no server connection
// keeps anything of a client's. The keepalive goes into the dialer in every
// mode. A parameter the connection string already sets (?statement_timeout=0,
// say) is left as given. s must have been resolved.
func (s DBSettings) Apply(cfg *pgxpool.Config) {
	params := cfg.ConnConfig.RuntimeParams
	var names, values []string
	set := func(name, value string) {
		if _, given := params[name]; !given {
			names, values = append(names, name), append(values, value)
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
	switch s.Pooler {
	case pooler.Transaction:
		// CacheDescribe: one unnamed statement per round trip, its
		// description cached per connection; no "stmtcache_..." names that
		// another client's server connection already holds.
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	case pooler.Session:
		var sql strings.Builder
		for i, n := range names {
			fmt.Fprintf(&sql, "SET %s = %s;", n, values[i])
		}
		if sql.Len() == 0 {
			return
		}
		stmt, prev := sql.String(), cfg.AfterConnect
		cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
			if prev != nil {
				if err := prev(ctx, c); err != nil {
					return err
				}
			}
			_, err := c.PgConn().Exec(ctx, stmt).ReadAll()
			return err
		}
	default:
		for i, n := range names {
			params[n] = values[i]
		}
	}
}

// OpenPool connects a service's pool to databaseURL with the session settings
// s (already resolved). minConns raises the pool's size when the URL's
// pool_max_conns is smaller. Errors name --database-url.
func OpenPool(ctx context.Context, databaseURL string, s DBSettings, minConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgurl.Parse(databaseURL)
	if err != nil {
		return nil, fmt.Errorf(pgurl.DatabaseURLSetting+": %w", err)
	}
	if cfg.MaxConns < minConns {
		cfg.MaxConns = minConns
	}
	s.Apply(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf(pgurl.DatabaseURLSetting+": %w", err)
	}
	return pool, nil
}

// Reach pings pool and names the real cause when it cannot: a start-up
// parameter refused (what PgBouncer answers, unless told to ignore them)
// means a pooler the settings do not know of, not an unreachable server.
// Straight to PostgreSQL (Pooler none) it also checks that no pooler is in
// between after all: the backend process id PostgreSQL gave at start-up is
// the one serving the connection. Errors name --database-url.
func (s DBSettings) Reach(ctx context.Context, pool *pgxpool.Pool) error {
	if s.Pooler != "" && s.Pooler != pooler.None {
		return nil // the service's start-up check reaches the server
	}
	behind, err := pooler.PoolBehind(ctx, pool)
	if err != nil {
		if r := pooler.Refused(err, "set --pooler (DB_POOLER) to its pool mode, transaction or session (see docs/pooler.md)"); r != nil {
			return fmt.Errorf(pgurl.DatabaseURLSetting+": %w", r)
		}
		return fmt.Errorf(pgurl.DatabaseURLSetting+": cannot reach PostgreSQL: %w", err)
	}
	if behind {
		return fmt.Errorf(pgurl.DatabaseURLSetting + " goes through a connection pooler (the server process serving it is not the one named at start-up): " +
			"set --pooler (DB_POOLER) to its pool mode, transaction or session (see docs/pooler.md)")
	}
	return nil
}

// SchemaAdvice adds to err, when it says migrations are missing
// (*migrations.SchemaError), how the command applies them.
func SchemaAdvice(err error, advice string) error {
	var se *migrations.SchemaError
	if errors.As(err, &se) {
		return fmt.Errorf("%w: %s", err, advice)
	}
	return err
}

// PoolerPollInterval is the relay's poll of idle partitions by default
// behind a pooler in transaction mode without --listen-url: no LISTEN wakes
// it, so an event waits for the next poll (about half of it on average).
const PoolerPollInterval = 100 * time.Millisecond

// Listen says how a service with settings s is woken: LISTEN on cc (nil: on
// the pool's own connection settings), or, behind a pooler in transaction
// mode without --listen-url, no LISTEN at all (off): the services poll. s
// must have been resolved.
func (s DBSettings) Listen() (cc *pgx.ConnConfig, off bool, err error) {
	if s.Pooler != pooler.Transaction {
		return nil, false, nil
	}
	if s.ListenURL == "" {
		return nil, true, nil
	}
	// Straight to PostgreSQL: the session settings as start-up parameters,
	// and the keepalive that notices a vanished server under an idle LISTEN.
	pcfg, err := pgurl.Parse(s.ListenURL)
	if err != nil {
		return nil, false, fmt.Errorf("--listen-url (DB_LISTEN_URL): %w", err)
	}
	direct := s
	direct.Pooler = pooler.None
	direct.Apply(pcfg)
	return pcfg.ConnConfig, false, nil
}
