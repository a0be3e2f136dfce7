package cli_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/cli"
	"github.com/pgrelay/pgrelay/internal/logtest"
	"github.com/pgrelay/pgrelay/internal/pgurl"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

func TestDBSettingsResolveNamesTheSetting(t *testing.T) {
	t.Parallel()
	ok := cli.DBSettings{StatementTimeout: time.Minute, TCPKeepalive: 30 * time.Second}
	s, err := ok.Resolve(30*time.Second, 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, 30*time.Second, s.IdleInTransactionTimeout, "0 takes the lease")

	cases := []struct {
		s    cli.DBSettings
		want string
	}{
		{cli.DBSettings{StatementTimeout: -time.Second}, "--db-statement-timeout (DB_STATEMENT_TIMEOUT)"},
		{cli.DBSettings{StatementTimeout: time.Microsecond}, "--db-statement-timeout (DB_STATEMENT_TIMEOUT) must be at least 1ms"},
		{cli.DBSettings{StatementTimeout: 1000 * time.Hour}, "--db-statement-timeout (DB_STATEMENT_TIMEOUT) must be at most"},
		{cli.DBSettings{IdleInTransactionTimeout: 5 * time.Second}, "--db-idle-in-transaction-timeout (DB_IDLE_IN_TRANSACTION_TIMEOUT) must exceed the handler timeout 10s"},
		{cli.DBSettings{IdleInTransactionTimeout: time.Nanosecond}, "--db-idle-in-transaction-timeout (DB_IDLE_IN_TRANSACTION_TIMEOUT) must be at least 1ms"},
		{cli.DBSettings{TCPKeepalive: -time.Second}, "--db-tcp-keepalive (DB_TCP_KEEPALIVE)"},
		{cli.DBSettings{TCPKeepalive: 500 * time.Millisecond}, "--db-tcp-keepalive (DB_TCP_KEEPALIVE)"},
	}
	for _, c := range cases {
		_, err := c.s.Resolve(30*time.Second, 10*time.Second)
		require.ErrorContains(t, err, c.want, "%+v", c.s)
	}
	s, err = cli.DBSettings{IdleInTransactionTimeout: -1}.Resolve(30*time.Second, 10*time.Second)
	require.NoError(t, err, "negative disables")
	require.Negative(t, s.IdleInTransactionTimeout)
}

// TestPoolSessionSettings: every connection of a service's pool carries the
// session settings, and a value the connection string gives wins.
func TestPoolSessionSettings(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := cli.DBSettings{StatementTimeout: 45 * time.Second, TCPKeepalive: 20 * time.Second}.Resolve(12*time.Second, 0)
	require.NoError(t, err)
	pool, err := cli.OpenPool(ctx, url, s, 2)
	require.NoError(t, err)
	defer pool.Close()
	show := func(p *pgxpool.Pool, name string) string {
		var v string
		require.NoError(t, p.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v))
		return v
	}
	require.Equal(t, "45s", show(pool, "statement_timeout"))
	require.Equal(t, "12s", show(pool, "idle_in_transaction_session_timeout"))
	// TCP only: over a Unix socket the server ignores the keepalive settings.
	var tcp bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT inet_client_addr() IS NOT NULL").Scan(&tcp))
	if tcp {
		require.Equal(t, "20", show(pool, "tcp_keepalives_idle"))
		require.Equal(t, "6", show(pool, "tcp_keepalives_interval"))
		require.Equal(t, "3", show(pool, "tcp_keepalives_count"))
	}

	given, err := cli.OpenPool(ctx, url+"&statement_timeout=0", s, 1)
	require.NoError(t, err)
	defer given.Close()
	require.Equal(t, "0", show(given, "statement_timeout"))
	require.Equal(t, "12s", show(given, "idle_in_transaction_session_timeout"))
}

// TestHungBatchSessionIsEndedAndTakenOver: a batch whose handler hangs with
// its transaction open (ignoring its context) holds the row locks of the
// events it already processed. Lost-lease takeover skips locked rows, so
// without a server-side idle in transaction timeout those events stay
// processing for as long as the hung process lives. With the pool's session
// settings the server ends the hung session, the locks go, and another worker
// takes every event over.
func TestHungBatchSessionIsEndedAndTakenOver(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	const lease, handlerTimeout = 2 * time.Second, 300 * time.Millisecond
	s, err := cli.DBSettings{StatementTimeout: time.Minute}.Resolve(lease, handlerTimeout)
	require.NoError(t, err)
	hungPool, err := cli.OpenPool(ctx, url, s, 4)
	require.NoError(t, err)
	defer hungPool.Close()
	plain, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	defer plain.Close()

	ids := []string{"hung-1", "hung-2", "hung-3"}
	var msgs []pgrelay.Incoming
	for _, id := range ids {
		msgs = append(msgs, pgrelay.Incoming{Message: pgrelay.Message{EventID: id, Topic: "t", Key: id, EventType: "E", Payload: []byte("{}")}})
	}
	_, err = pgrelay.Receive(ctx, plain, msgs)
	require.NoError(t, err)

	// The hung worker: processes hung-1 (its processed mark row-locks it
	// inside the batch transaction), then hangs in hung-2's handler.
	unblock := make(chan struct{})
	var hanging atomic.Bool
	hung, err := pgrelay.NewInboxWorker(pgrelay.InboxConfig{
		Pool: hungPool, Logger: logtest.New(t), Workers: 1, BatchSize: 10,
		Lease: lease, HandlerTimeout: handlerTimeout, PollInterval: 50 * time.Millisecond,
		Handler: pgrelay.HandlerFunc(func(_ context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
			if ev.EventID == "hung-2" {
				hanging.Store(true)
				<-unblock // ignores its context: a hung process
			}
			return nil
		}),
	})
	require.NoError(t, err)
	hungCtx, stopHung := context.WithCancel(ctx)
	hungDone := make(chan struct{})
	go func() { defer close(hungDone); _ = hung.Run(hungCtx) }()
	defer func() { stopHung(); <-hungDone }()
	defer close(unblock) // runs before the wait for the hung worker
	require.Eventually(t, hanging.Load, 20*time.Second, 10*time.Millisecond)

	// A healthy worker takes over whatever the hung one lost.
	var healthyRan atomic.Int32
	healthy, err := pgrelay.NewInboxWorker(pgrelay.InboxConfig{
		Pool: plain, Logger: logtest.New(t), Workers: 1, BatchSize: 10,
		Lease: lease, HandlerTimeout: handlerTimeout, PollInterval: 50 * time.Millisecond,
		Handler: pgrelay.HandlerFunc(func(context.Context, pgx.Tx, *pgrelay.InboxEvent) error {
			healthyRan.Add(1)
			return nil
		}),
	})
	require.NoError(t, err)
	healthyCtx, stopHealthy := context.WithCancel(ctx)
	healthyDone := make(chan struct{})
	go func() { defer close(healthyDone); _ = healthy.Run(healthyCtx) }()
	defer func() { stopHealthy(); <-healthyDone }()

	deadline := time.Now().Add(6 * lease)
	for {
		var processing []string
		rows, err := plain.Query(ctx, "SELECT event_id FROM pgrelay.inbox WHERE status <> 'processed' ORDER BY event_id")
		require.NoError(t, err)
		processing, err = pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		if len(processing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("events %v still not processed %s after the hang (the hung session still holds their locks)",
				processing, 6*lease)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var active int
	require.NoError(t, plain.QueryRow(ctx,
		"SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state = 'idle in transaction'").Scan(&active))
	require.Zero(t, active, "the hung session was ended by the server")
	require.Positive(t, healthyRan.Load(), "the healthy worker ran the taken-over events")
}

// TestMigrateDownForce: `migrate down` refuses to drop the inbox while it
// holds events, saying how to override; --force drops it.
func TestMigrateDownForce(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	defer pool.Close()
	_, err = pool.Exec(ctx, `INSERT INTO pgrelay.inbox (event_id, topic) VALUES ('e1', 't')`)
	require.NoError(t, err)

	down := func(args ...string) error {
		u := url
		cmd := cli.MigrateCommand(pgurl.One(&u))
		cmd.SetArgs(append([]string{"down"}, args...))
		cmd.SetOut(io.Discard)
		cmd.SilenceUsage, cmd.SilenceErrors = true, true
		return cmd.ExecuteContext(ctx)
	}
	var refusal error
	for range 50 {
		if refusal = down(); refusal != nil {
			break
		}
	}
	require.ErrorContains(t, refusal, "migrate down refused: 00001_inbox.sql was not rolled back, nothing was changed")
	require.ErrorContains(t, refusal, "00001_inbox would drop data")
	require.ErrorContains(t, refusal, "--force")
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pgrelay.inbox`).Scan(&n))
	require.Equal(t, 1, n)

	require.NoError(t, down("--force"))
	var exists bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT to_regclass('pgrelay.inbox') IS NOT NULL`).Scan(&exists))
	require.False(t, exists)
}

// TestSeveralHostsNeedTargetSessionAttrs: a connection string naming several
// hosts is refused, before any connection, unless target_session_attrs keeps
// the services and migrations off standbys; with it, it is taken.
func TestSeveralHostsNeedTargetSessionAttrs(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const hosts = "postgres://127.0.0.1:1,127.0.0.1:2/db?sslmode=disable"
	want := "--database-url (DATABASE_URL): several hosts need target_session_attrs=read-write"
	_, err := cli.OpenPool(ctx, hosts, cli.DBSettings{}, 1)
	require.ErrorContains(t, err, want)
	require.ErrorContains(t, cli.MigrateUp(ctx, hosts), want)
	_, err = cli.DBSettings{Pooler: "transaction", ListenURL: "host=127.0.0.1,127.0.0.2 port=1"}.Resolve(time.Second, 0)
	require.ErrorContains(t, err, "--listen-url (DB_LISTEN_URL): several hosts need target_session_attrs")

	pool, err := cli.OpenPool(ctx, hosts+"&target_session_attrs=read-write", cli.DBSettings{}, 1)
	require.NoError(t, err)
	pool.Close()
	_, err = cli.OpenPool(ctx, "host=127.0.0.1,127.0.0.2 port=1 target_session_attrs=primary", cli.DBSettings{}, 1)
	require.NoError(t, err)
}

// TestSeveralHostsPassOverAHungOne: the first host accepts connections and
// never answers (a frozen server, a vanished one whose address still takes
// the handshake); a connection still reaches the second one well within the
// services' 10s statement deadline, each host getting a few seconds of it.
func TestSeveralHostsPassOverAHungOne(t *testing.T) {
	t.Parallel()
	hung, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	accepted := make(chan net.Conn, 16)
	t.Cleanup(func() {
		_ = hung.Close()
		for len(accepted) > 0 {
			_ = (<-accepted).Close()
		}
	})
	go func() {
		for {
			c, err := hung.Accept()
			if err != nil {
				return
			}
			select {
			case accepted <- c:
			default:
				_ = c.Close()
			}
		}
	}()
	cfg, err := pgconn.ParseConfig(testdb.NewURL(t))
	require.NoError(t, err)
	url := fmt.Sprintf("postgres://%s@%s,%s:%d/%s?sslmode=disable&target_session_attrs=read-write",
		cfg.User, hung.Addr(), cfg.Host, cfg.Port, cfg.Database)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := cli.OpenPool(ctx, url, cli.DBSettings{}, 1)
	require.NoError(t, err)
	defer pool.Close()
	start := time.Now()
	require.NoError(t, pool.Ping(ctx), "the second host, past the hung first one")
	t.Logf("connected in %s", time.Since(start).Round(time.Millisecond))
}
