// Package integration tests pgrelay's binaries as real processes against a
// real PostgreSQL and NATS JetStream.
package integration

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/proc"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// binaries are built once per test binary run.
var binaries = proc.NewBinaries("./cmd/relay", "./cmd/consumer", "./cmd/demo")

// bins builds relay, consumer and demo into a temporary directory, once.
func bins(t *testing.T) string {
	t.Helper()
	return binaries.Dir(t)
}

func TestMain(m *testing.M) {
	code := m.Run()
	binaries.Remove()
	// A PostgreSQL container this binary started (make containers): removed
	// here, since the reaper is disabled where no registry serves its image.
	if err := testdb.Terminate(); err != nil {
		fmt.Fprintln(os.Stderr, "testdb: terminate container:", err)
		code = max(code, 1)
	}
	os.Exit(code)
}

// service is a binary running as a child process for one test.
type service struct{ *proc.Process }

// startService runs bin with args and env (added to the test's environment);
// it is stopped with SIGTERM when the test ends, and its output's end is
// logged when the test failed.
func startService(t *testing.T, bin string, env []string, args ...string) *service {
	t.Helper()
	p := proc.New(filepath.Base(bin), bin, args, env, "")
	require.NoError(t, p.Start())
	t.Cleanup(func() {
		_ = p.Stop(30 * time.Second)
		if t.Failed() {
			t.Logf("%s output:\n%s", p.Name(), p.Output())
		}
	})
	return &service{p}
}

func (s *service) running() bool { return s.Running() }

// stop sends SIGTERM and waits for a graceful exit (killing after 30s).
func (s *service) stop() error { return s.Stop(30 * time.Second) }

// kill sends SIGKILL and waits for the process to die.
func (s *service) kill() { s.Kill() }

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}

// freeAddr returns a free loopback address for a service's HTTP listener.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

func newPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

func queryInt(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n int64
	require.NoError(t, pool.QueryRow(ctx, sql, args...).Scan(&n))
	return n
}

func consumerEnv(dbURL, natsURL, stream, prefix string, extra ...string) []string {
	return append([]string{
		"DATABASE_URL=" + dbURL, "NATS_URL=" + natsURL,
		"CONSUMER_STREAM=" + stream, "CONSUMER_SUBJECT_PREFIX=" + prefix,
		"CONSUMER_DURABLE=it", "CONSUMER_MAX_WAIT=100ms", "CONSUMER_ACK_WAIT=2s",
		"LOG_LEVEL=info", "LOG_FORMAT=json", "METRICS_ADDR=", "ADMIN_ADDR=", "CONSUMER_STATS_INTERVAL=2s",
	}, extra...)
}
