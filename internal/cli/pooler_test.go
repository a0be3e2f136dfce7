package cli_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/cli"
	"github.com/pgrelay/pgrelay/internal/pooler"
	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/internal/testpgbouncer"
)

// resolved is the services' default DBSettings behind mode.
func resolved(t *testing.T, mode pooler.Mode) cli.DBSettings {
	t.Helper()
	s, err := cli.DBSettings{StatementTimeout: cli.DefaultStatementTimeout, TCPKeepalive: cli.DefaultTCPKeepalive, Pooler: mode}.Resolve(15*time.Second, 0)
	require.NoError(t, err)
	return s
}

// TestPoolThroughPgBouncerTransactionMode: a stock PgBouncer in transaction
// mode refuses the start-up parameters the default settings send, and the
// start-up check says so (not "cannot reach PostgreSQL"); with --pooler
// transaction the pool connects, and many goroutines running parameterised
// statements at once meet no "prepared statement already exists" (42P05),
// which pgx's statement cache hits when server connections change hands.
func TestPoolThroughPgBouncerTransactionMode(t *testing.T) {
	t.Parallel()
	pgb := testpgbouncer.URL(t, testdb.NewURL(t), testpgbouncer.Transaction)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	pool, err := cli.OpenPool(ctx, pgb, resolved(t, pooler.None), 4)
	require.NoError(t, err)
	err = resolved(t, pooler.None).Reach(ctx, pool)
	pool.Close()
	require.Error(t, err)
	require.Contains(t, err.Error(), "refused the start-up parameter")
	require.Contains(t, err.Error(), "--pooler (DB_POOLER)")
	require.NotContains(t, err.Error(), "cannot reach")

	s := resolved(t, pooler.Transaction)
	pool, err = cli.OpenPool(ctx, pgb, s, 20)
	require.NoError(t, err)
	defer pool.Close()
	require.NoError(t, s.Reach(ctx, pool))
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for g := range 20 {
		wg.Go(func() {
			for i := range 50 {
				var got string
				if err := pool.QueryRow(ctx, "SELECT $1::text || '-' || $2::int", fmt.Sprint(g), i).Scan(&got); err != nil {
					errs <- err
					return
				}
				if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, "SELECT count(*) FROM pgrelay.outbox WHERE event_id::text = $1", got)
					return err
				}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// TestPoolThroughPgBouncerSessionMode: in session mode the settings are SET
// after connecting instead of sent at start-up (which PgBouncer refuses), so
// the statement and idle in transaction timeouts are in force.
func TestPoolThroughPgBouncerSessionMode(t *testing.T) {
	t.Parallel()
	pgb := testpgbouncer.URL(t, testdb.NewURL(t), testpgbouncer.Session)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := resolved(t, pooler.Session)
	pool, err := cli.OpenPool(ctx, pgb, s, 4)
	require.NoError(t, err)
	defer pool.Close()
	require.NoError(t, s.Reach(ctx, pool))
	var stmt, idle, keepalive string
	require.NoError(t, pool.QueryRow(ctx, "SELECT current_setting('statement_timeout'), current_setting('idle_in_transaction_session_timeout'), current_setting('tcp_keepalives_idle')").
		Scan(&stmt, &idle, &keepalive))
	require.Equal(t, "1min", stmt)
	require.Equal(t, "15s", idle)
	require.Equal(t, "30", keepalive)
}

// TestMigrateRefusesAPooler: migrations need one session (goose's session
// advisory lock); through PgBouncer they are refused with the reason.
func TestMigrateRefusesAPooler(t *testing.T) {
	t.Parallel()
	pgb := testpgbouncer.URL(t, testdb.NewURL(t), testpgbouncer.Transaction)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := cli.MigrateUp(ctx, pgb)
	require.Error(t, err)
	require.Contains(t, err.Error(), "migrations need a direct connection to PostgreSQL")
}

// TestPoolerBehind: the backend process id PgBouncer gives a client is not
// the server's; PostgreSQL's own is.
func TestPoolerBehind(t *testing.T) {
	t.Parallel()
	direct := testdb.NewURL(t)
	pgb := testpgbouncer.URL(t, direct, testpgbouncer.Transaction)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for url, want := range map[string]bool{direct: false, pgb: true} {
		conn, err := pgx.Connect(ctx, url)
		require.NoError(t, err)
		behind, err := pooler.Behind(ctx, conn)
		require.NoError(t, err)
		require.Equal(t, want, behind, url)
		require.NoError(t, conn.Close(ctx))
	}
}

func TestParsePooler(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]pooler.Mode{"": pooler.None, "none": pooler.None, "Transaction": pooler.Transaction, " session ": pooler.Session} {
		got, err := pooler.Parse(in)
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
	_, err := pooler.Parse("statement")
	require.ErrorContains(t, err, "must be none, session or transaction")
	_, err = cli.DBSettings{Pooler: pooler.Session, ListenURL: "postgres://x/y"}.Resolve(time.Second, 0)
	require.ErrorContains(t, err, "--listen-url (DB_LISTEN_URL) is for --pooler transaction")
}

// TestReachFindsAnUndeclaredPooler: a pooler that lets the connection in
// (one told to ignore start-up parameters, here a pool sending none) is
// still found at start-up when --pooler is not set, instead of running with
// its settings silently dropped.
func TestReachFindsAnUndeclaredPooler(t *testing.T) {
	t.Parallel()
	direct := testdb.NewURL(t)
	pgb := testpgbouncer.URL(t, direct, testpgbouncer.Session)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for url, want := range map[string]string{direct: "", pgb: "goes through a connection pooler"} {
		pool, err := pgxpool.New(ctx, url)
		require.NoError(t, err)
		err = resolved(t, pooler.None).Reach(ctx, pool)
		pool.Close()
		if want == "" {
			require.NoError(t, err)
		} else {
			require.ErrorContains(t, err, want)
			require.ErrorContains(t, err, "set --pooler (DB_POOLER)")
		}
	}
}

// TestReachThroughPgBouncerIgnoringStartupParameters: a PgBouncer in
// transaction mode told to ignore the start-up parameters the default
// settings send lets the services in; without --pooler the start-up check
// still names the pooler and --pooler, for the first service and for the
// next ones, whose server connection holds the first one's statements, not
// "prepared statement already exists" (42P05).
func TestReachThroughPgBouncerIgnoringStartupParameters(t *testing.T) {
	t.Parallel()
	pgb := testpgbouncer.URL(t, testdb.NewURL(t), testpgbouncer.Transaction,
		"statement_timeout", "idle_in_transaction_session_timeout", "tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for range 3 {
		pool, err := cli.OpenPool(ctx, pgb, resolved(t, pooler.None), 4)
		require.NoError(t, err)
		err = resolved(t, pooler.None).Reach(ctx, pool)
		pool.Close()
		require.ErrorContains(t, err, "goes through a connection pooler")
		require.ErrorContains(t, err, "set --pooler (DB_POOLER)")
	}
}

// TestOperatorPoolThroughPgBouncer: the admin CLI's and the console's pool
// (pooler.NewPool) describes its statements when DB_POOLER=transaction, so
// that it meets no statement clash (42P05) through a transaction pooler.
func TestOperatorPoolThroughPgBouncer(t *testing.T) {
	pgb := testpgbouncer.URL(t, testdb.NewURL(t), testpgbouncer.Transaction)
	t.Setenv("DB_POOLER", "transaction")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pooler.NewPool(ctx, pgb)
	require.NoError(t, err)
	defer pool.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 10)
	for g := range 10 {
		wg.Go(func() {
			for i := range 50 {
				var n int
				if err := pool.QueryRow(ctx, "SELECT $1::int + $2::int", g, i).Scan(&n); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// TestListenSettings: only transaction mode changes the wake-ups: without
// --listen-url no LISTEN, with it a direct connection carrying the session
// settings and the keepalive.
func TestListenSettings(t *testing.T) {
	t.Parallel()
	for _, mode := range []pooler.Mode{pooler.None, pooler.Session} {
		cc, off, err := resolved(t, mode).Listen()
		require.NoError(t, err)
		require.Nil(t, cc)
		require.False(t, off)
	}
	cc, off, err := resolved(t, pooler.Transaction).Listen()
	require.NoError(t, err)
	require.Nil(t, cc)
	require.True(t, off, "no LISTEN through a transaction pooler")

	s := resolved(t, pooler.Transaction)
	s.ListenURL = "postgres://postgres@db.example:5432/app?sslmode=disable"
	s, err = s.Resolve(15*time.Second, 0)
	require.NoError(t, err)
	cc, off, err = s.Listen()
	require.NoError(t, err)
	require.False(t, off)
	require.Equal(t, "db.example", cc.Host)
	require.Equal(t, "60000", cc.RuntimeParams["statement_timeout"])
	require.NotNil(t, cc.DialFunc, "keepalive dialer")
}
