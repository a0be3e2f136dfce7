package httpidem_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/httpidem"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

const childEnv = "PGRELAY_HTTPIDEM_CRASH_CHILD_DB"

// TestCrashChildServer is the server process TestServerKilledMidRequest
// kills; it does nothing unless started by that test.
func TestCrashChildServer(t *testing.T) {
	url := os.Getenv(childEnv)
	if url == "" {
		return
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	b := newBundle(t, pool, httpidem.Config{})
	b.setHook(func(ctx context.Context, r *http.Request) {
		fmt.Println("RUNNING")
		<-ctx.Done() // hold the request until the process is killed
	})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	fmt.Println("ADDR", l.Addr().String())
	_ = http.Serve(l, b.mux())
}

// TestServerKilledMidRequest SIGKILLs the server process while the handler
// of the first request runs, its charge inserted but not committed: the
// database rolls the transaction back, the key is free, nothing is half
// stored, and the retry (to a new server) charges once.
func TestServerKilledMidRequest(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	createCharges(t, pool)

	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestCrashChildServer$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+url)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := bufio.NewScanner(out)
	next := func(prefix string) string {
		for lines.Scan() {
			if l := lines.Text(); strings.HasPrefix(l, prefix) {
				return strings.TrimSpace(strings.TrimPrefix(l, prefix))
			}
		}
		t.Fatalf("child ended before %q: %v", prefix, lines.Err())
		return ""
	}
	addr := next("ADDR")

	b := &bundle{pool: pool, srv: &httptest.Server{URL: "http://" + addr}}
	failed := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, b.srv.URL+"/payments", strings.NewReader(payment))
		req.Header.Set(httpidem.HeaderName, `"kill-1"`)
		res, err := http.DefaultClient.Do(req)
		if err == nil {
			res.Body.Close()
			err = fmt.Errorf("got a response: %d", res.StatusCode)
		}
		failed <- err
	}()
	next("RUNNING")
	require.NoError(t, cmd.Process.Kill()) // SIGKILL mid-request
	_ = cmd.Wait()
	t.Logf("client saw: %v", <-failed)

	// The child's backends end once they see their client gone.
	require.Eventually(t, func() bool {
		return b.count(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`) == 0
	}, 20*time.Second, 50*time.Millisecond)
	b.waitNoAdvisoryLocks(t)
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM charges`), "the uncommitted charge rolled back")
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM pgrelay.http_idempotency_keys`), "nothing half stored")

	// A new server on the same database: the key is free, the retry runs once.
	nb := newBundle(t, pool, httpidem.Config{})
	nb.srv = httptest.NewServer(nb.mux())
	t.Cleanup(nb.srv.Close)
	retry := nb.post(t, `"kill-1"`, payment)
	require.Equal(t, http.StatusCreated, retry.Status, retry.Body)
	again := nb.post(t, `"kill-1"`, payment)
	require.True(t, again.Replayed)
	require.Equal(t, retry.Body, again.Body)
	require.Equal(t, 1, nb.count(t, `SELECT count(*) FROM charges`))
}
