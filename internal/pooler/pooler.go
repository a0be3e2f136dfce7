// Package pooler knows what a connection pooler such as PgBouncer in front of
// PostgreSQL changes for pgrelay's services, and how to recognise one: the
// start-up parameters it refuses, the session it does not keep (transaction
// mode), and the backend process id it hides.
package pooler

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgrelay/pgrelay/internal/pgurl"
	"github.com/pgrelay/pgrelay/migrations"
)

// Mode is how the services' database connections reach PostgreSQL.
type Mode string

// The modes.
const (
	// None: straight to PostgreSQL (or through a transparent TCP proxy).
	// Session settings travel as start-up parameters; LISTEN wakes the
	// services.
	None Mode = "none"
	// Session: through a pooler in session mode (a client keeps its server
	// connection until it disconnects). Session settings are SET after
	// connecting, since poolers refuse most start-up parameters.
	Session Mode = "session"
	// Transaction: through a pooler in transaction mode (a client holds a
	// server connection only for a transaction). Nothing may be left in the
	// session: no start-up parameters, no named prepared statements, no
	// LISTEN, no session advisory locks.
	Transaction Mode = "transaction"
)

// Parse accepts "none" (or ""), "session" and "transaction".
func Parse(s string) (Mode, error) {
	switch m := Mode(strings.ToLower(strings.TrimSpace(s))); m {
	case "", None:
		return None, nil
	case Session, Transaction:
		return m, nil
	}
	return None, fmt.Errorf("must be none, session or transaction, got %q", s)
}

// RefusedParameter returns the start-up parameter err says the server
// refused ("unsupported startup parameter: statement_timeout", PgBouncer's
// answer to any parameter it does not track), or "".
func RefusedParameter(err error) string {
	const marker = "unsupported startup parameter"
	var pgErr *pgconn.PgError
	msg := ""
	if errors.As(err, &pgErr) {
		msg = pgErr.Message
	} else if err != nil {
		msg = err.Error()
	}
	i := strings.Index(msg, marker)
	if i < 0 {
		return ""
	}
	p := strings.TrimSpace(strings.TrimPrefix(msg[i+len(marker):], ":"))
	if j := strings.IndexAny(p, " (\n"); j >= 0 {
		p = p[:j]
	}
	if p == "" {
		p = "(unnamed)"
	}
	return p
}

// StatementClash reports whether err is a named prepared statement that
// already exists (SQLSTATE 42P05): what pgx's statement cache meets through
// a pooler in transaction mode, which hands a client another client's
// server connection.
func StatementClash(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42P05"
}

// Behind reports whether conn reaches PostgreSQL through a pooler: the
// backend process id the server gave at start-up (BackendKeyData) is not the
// one serving the connection (pg_backend_pid()). PgBouncer, like other
// poolers, hands each client an id of its own; PostgreSQL itself, and a
// plain TCP proxy, give the real one. The query goes in the simple
// protocol: a statement prepared under a name would meet, through a pooler
// in transaction mode, the same name another client left on the server
// connection (42P05) before the check could name the pooler.
func Behind(ctx context.Context, conn *pgx.Conn) (bool, error) {
	var pid uint32
	if err := conn.QueryRow(ctx, "SELECT pg_catalog.pg_backend_pid()::bigint", pgx.QueryExecModeSimpleProtocol).Scan(&pid); err != nil {
		return false, err
	}
	return pid != conn.PgConn().PID(), nil
}

// PoolBehind is Behind on one of pool's connections.
func PoolBehind(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	defer c.Release()
	return Behind(ctx, c.Conn())
}

// NewPool is pgxpool.New for the operator commands (the admin CLI, the
// console), which take no --pooler flag: behind a pooler in transaction mode
// (env DB_POOLER=transaction) their statements are described, never named,
// as the services' are.
func NewPool(ctx context.Context, databaseURL string) (*pgxpool.Pool, error) {
	cfg, err := pgurl.Parse(databaseURL)
	if err != nil {
		return nil, err
	}
	if m, _ := Parse(os.Getenv("DB_POOLER")); m == Transaction {
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

// Refused returns err worded for a start-up parameter the server refused,
// with advice on what to change, or nil when err is not that.
func Refused(err error, advice string) error {
	p := RefusedParameter(err)
	if p == "" {
		return nil
	}
	return fmt.Errorf("the server refused the start-up parameter %s, as a connection pooler (PgBouncer) does: %s: %w", p, advice, err)
}

// CheckStart is the consumer's start-up check: pool reaches PostgreSQL and
// its database has every migration (running on a partial schema would only
// loop on errors). Its errors say what to change in the pool's settings; a
// *migrations.SchemaError is among them when migrations are missing.
func CheckStart(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := CheckSchema(ctx, pool, 0)
	return err
}

// CheckSchema is CheckStart for a service that runs on older schemas too
// (the relay): the database must have every migration up to version
// minimum (0: every one). It returns the schema's status.
func CheckSchema(ctx context.Context, pool *pgxpool.Pool, minimum int64) (migrations.Status, error) {
	if err := pool.Ping(ctx); err != nil {
		if r := Refused(err, "leave it out of the pool's RuntimeParams (docs/pooler.md)"); r != nil {
			return migrations.Status{}, r
		}
		return migrations.Status{}, fmt.Errorf("cannot reach PostgreSQL: %w", err)
	}
	st, err := SchemaStatus(ctx, pool)
	if err == nil {
		err = st.Require(minimum)
	}
	if err != nil {
		if StatementClash(err) {
			return st, fmt.Errorf("%w: a connection pooler in transaction mode shares server connections: "+
				"set the pool's ConnConfig.DefaultQueryExecMode to pgx.QueryExecModeCacheDescribe (docs/pooler.md)", err)
		}
		return st, fmt.Errorf("%w; apply the migrations first", err)
	}
	return st, nil
}

// SchemaStatus reads the schema version of pool's database
// (migrations.ReadStatus).
func SchemaStatus(ctx context.Context, pool *pgxpool.Pool) (migrations.Status, error) {
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()
	return migrations.ReadStatus(ctx, sqlDB)
}
