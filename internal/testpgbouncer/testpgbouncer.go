// Package testpgbouncer runs a PgBouncer of a test's own in front of the
// test's PostgreSQL database: a generated configuration (trust
// authentication, the pool mode asked for, and the ignore_startup_parameters
// asked for, none by default, so that a client sending a session setting at
// start-up is refused as by a stock PgBouncer) on a free loopback port. It skips when pgbouncer is not
// installed, except under CI (CI set), where it fails: .ci/run installs
// Debian's package.
package testpgbouncer

import (
	"bytes"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Modes a pgbouncer pools in.
const (
	Transaction = "transaction"
	Session     = "session"
)

// Binary returns the pgbouncer executable, skipping (failing under CI) the
// test when there is none.
func Binary(tb testing.TB) string {
	tb.Helper()
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
		return "/usr/sbin/pgbouncer"
	}
	if os.Getenv("CI") != "" {
		tb.Fatal("pgbouncer is required for the connection pooler tests under CI (apt-get install pgbouncer; .ci/run installs it)")
	}
	tb.Skip("pgbouncer not installed: the connection pooler tests need it (apt-get install pgbouncer)")
	return ""
}

// syncBuffer collects the process's output.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// URL starts a pgbouncer pooling in mode (Transaction or Session) for the
// database dbURL names, ignoring the start-up parameters named by ignore,
// stopped when the test ends, and returns dbURL with its host and port
// replaced by the pgbouncer's.
func URL(tb testing.TB, dbURL, mode string, ignore ...string) string {
	tb.Helper()
	bin := Binary(tb)
	u, err := url.Parse(dbURL)
	if err != nil {
		tb.Fatalf("testpgbouncer: database URL: %v", err)
	}
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = "5432"
	}
	dbname := strings.TrimPrefix(u.Path, "/")
	username := "postgres"
	if u.User != nil && u.User.Username() != "" {
		username = u.User.Username()
	}
	listen := freePort(tb)

	// pgbouncer refuses to run as root: it then drops to the postgres
	// account (-u), which must read the configuration, so the directory is
	// world-readable and nothing is written into it.
	dir, err := os.MkdirTemp("", "pgrelay-pgbouncer-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	ini := fmt.Sprintf(`[databases]
%s = host=%s port=%s dbname=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = %s
max_client_conn = 1000
default_pool_size = %d
server_login_retry = 1
ignore_startup_parameters = %s
`, dbname, host, port, dbname, listen, filepath.Join(dir, "users.txt"), mode, poolSize(mode), strings.Join(ignore, ","))
	for name, body := range map[string]string{"pgbouncer.ini": ini, "users.txt": fmt.Sprintf("%q \"\"\n", username)} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	args := []string{filepath.Join(dir, "pgbouncer.ini")}
	if os.Geteuid() == 0 {
		account := "postgres"
		if _, err := user.Lookup(account); err != nil {
			account = "nobody"
		}
		args = append([]string{"-u", account}, args...)
	}
	out := &syncBuffer{}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		tb.Fatalf("testpgbouncer: start %s: %v", bin, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	tb.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if tb.Failed() {
			tb.Logf("pgbouncer (%s mode) output:\n%s", mode, tail(out.String(), 4000))
		}
	})
	addr := fmt.Sprintf("127.0.0.1:%d", listen)
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
			break
		}
		select {
		case <-done:
			tb.Fatalf("testpgbouncer: pgbouncer exited at start-up:\n%s", out.String())
		default:
		}
		if time.Now().After(deadline) {
			tb.Fatalf("testpgbouncer: pgbouncer did not listen on %s within 10s:\n%s", addr, out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	u.Host = addr
	return u.String()
}

// poolSize is the server connections per database: in session mode each
// client holds one for as long as it is connected (a relay's and a
// consumer's pools together), in transaction mode a few are shared.
func poolSize(mode string) int {
	if mode == Session {
		return 60
	}
	return 10
}

func freePort(tb testing.TB) int {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}
