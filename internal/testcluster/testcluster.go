// Package testcluster starts a private PostgreSQL cluster for a test (initdb
// in a temporary directory, on a free port), for the settings the shared
// server must keep as they are: wal_level = logical, a short
// wal_sender_timeout, max_slot_wal_keep_size. It is the chaos suite's
// cluster (integration/chaos), small enough for a package's tests. A test
// is skipped when the server binaries are missing.
package testcluster

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgrelay/pgrelay/migrations"
)

// BinDir holds initdb and pg_ctl; PGRELAY_PG_BIN overrides it.
func BinDir() string {
	if d := os.Getenv("PGRELAY_PG_BIN"); d != "" {
		return d
	}
	return "/usr/lib/postgresql/15/bin"
}

// Cluster is a running private cluster.
type Cluster struct {
	root, dir, logFile string
	Port               int
	asUser             string
}

// Start creates and starts a cluster with conf appended to its
// postgresql.conf, stops it when the test ends, and migrates its postgres
// database.
func Start(tb testing.TB, conf string) *Cluster {
	tb.Helper()
	if _, err := os.Stat(filepath.Join(BinDir(), "initdb")); err != nil {
		tb.Skipf("no PostgreSQL server binaries in %s: %v", BinDir(), err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := New(ctx, conf)
	if c != nil {
		tb.Cleanup(func() {
			c.Stop()
			if !tb.Failed() {
				c.removeFiles()
			} else {
				tb.Logf("cluster kept in %s", c.root)
			}
		})
	}
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// New creates and starts a cluster, as Start does, for a program (the demo,
// the benchmark): the caller stops it and removes its files with Remove.
// When it returns a cluster with an error, Remove still applies.
func New(ctx context.Context, conf string) (*Cluster, error) {
	if _, err := os.Stat(filepath.Join(BinDir(), "initdb")); err != nil {
		return nil, fmt.Errorf("no PostgreSQL server binaries in %s (set PGRELAY_PG_BIN): %w", BinDir(), err)
	}
	c, err := prepare()
	if err != nil {
		return c, err
	}
	port := c.Port
	if out, err := c.run(ctx, "initdb", "-D", c.dir, "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8"); err != nil {
		return c, fmt.Errorf("initdb: %w\n%s", err, out)
	}
	base := fmt.Sprintf("\nport = %d\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = ''\nfsync = off\nfull_page_writes = off\nmax_connections = 100\n", port)
	if err := c.appendConf(base + conf); err != nil {
		return c, err
	}
	if err := c.Start(ctx); err != nil {
		return c, err
	}
	db, err := sqlOpen(c.URL())
	if err != nil {
		return c, err
	}
	defer db.Close()
	if err := migrations.Up(ctx, db); err != nil {
		return c, fmt.Errorf("migrate the cluster: %w", err)
	}
	return c, nil
}

// prepare makes a cluster's directories (owned by the postgres user when
// run as root) and picks a free port; nothing runs yet.
func prepare() (*Cluster, error) {
	dir, err := os.MkdirTemp("", "pgrelay-cluster-")
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	c := &Cluster{root: dir, dir: filepath.Join(dir, "pgdata"), logFile: filepath.Join(dir, "postgres.log"), Port: port}
	if os.Geteuid() == 0 { // PostgreSQL refuses to run as root
		c.asUser = "postgres"
		u, err := user.Lookup("postgres")
		if err != nil {
			return c, fmt.Errorf("running as root needs a postgres user to own the cluster: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		for _, err := range []error{os.Chmod(dir, 0o755), os.MkdirAll(c.dir, 0o700), os.WriteFile(c.logFile, nil, 0o644),
			os.Chown(c.dir, uid, gid), os.Chown(c.logFile, uid, gid)} {
			if err != nil {
				return c, err
			}
		}
	}
	return c, nil
}

// appendConf adds lines to the cluster's postgresql.conf: a later setting
// wins over an earlier one.
func (c *Cluster) appendConf(lines string) error {
	f, err := os.OpenFile(filepath.Join(c.dir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(lines + "\n")
	return errors.Join(err, f.Close())
}

// Remove stops the server and deletes the cluster's files.
func (c *Cluster) Remove() {
	c.Stop()
	c.removeFiles()
}

// removeFiles deletes the cluster's files, retrying for a moment: a server
// process that outlives pg_ctl stop (the archiver) may still write one.
func (c *Cluster) removeFiles() {
	for range 20 {
		if err := os.RemoveAll(c.root); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Dir is the directory holding the cluster's data directory and log.
func (c *Cluster) Dir() string { return c.root }

// AsUser is the system user the server runs as ("" for the current one).
func (c *Cluster) AsUser() string { return c.asUser }

// URL is the cluster's postgres database.
func (c *Cluster) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.Port)
}

func (c *Cluster) run(ctx context.Context, bin string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	path := filepath.Join(BinDir(), bin)
	var cmd *exec.Cmd
	if c.asUser != "" {
		cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", c.asUser, "--", path}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, path, args...)
	}
	cmd.Dir = os.TempDir()
	return cmd.CombinedOutput()
}

// Start starts the (stopped) cluster.
func (c *Cluster) Start(ctx context.Context) error {
	if out, err := c.run(ctx, "pg_ctl", "start", "-w", "-t", "60", "-D", c.dir, "-l", c.logFile); err != nil {
		return fmt.Errorf("pg_ctl start: %w\n%s", err, out)
	}
	return nil
}

// Restart stops the server in mode (fast or immediate) and starts it again.
func (c *Cluster) Restart(ctx context.Context, mode string) error {
	if out, err := c.run(ctx, "pg_ctl", "stop", "-w", "-t", "60", "-m", mode, "-D", c.dir); err != nil {
		return fmt.Errorf("pg_ctl stop: %w\n%s", err, out)
	}
	return c.Start(ctx)
}

// Stop stops the server at once.
func (c *Cluster) Stop() {
	_, _ = c.run(context.Background(), "pg_ctl", "stop", "-w", "-t", "30", "-m", "immediate", "-D", c.dir)
}

// Log returns the server's log.
func (c *Cluster) Log() string {
	b, _ := os.ReadFile(c.logFile)
	return string(b)
}

func sqlOpen(url string) (*sql.DB, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	return stdlib.OpenDB(*cfg), nil
}
