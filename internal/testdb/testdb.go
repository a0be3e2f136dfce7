// Package testdb gives each test its own freshly migrated PostgreSQL database.
//
// The server is chosen in this order:
//  1. TEST_DATABASE_URL, when set.
//  2. A PostgreSQL container started with testcontainers-go's postgres module,
//     when a Docker provider is healthy. The image is PGRELAY_POSTGRES_IMAGE,
//     by default postgres:16-alpine; any image honouring the official one's
//     POSTGRES_USER, POSTGRES_PASSWORD and POSTGRES_DB and logging "database
//     system is ready to accept connections" after its init phase and again
//     when serving will do (deploy/images builds one from Debian's packages).
//  3. When CI is set: the test fails, so that CI never passes having run nothing.
//  4. Otherwise the test is skipped with a message saying how to point the
//     tests at a PostgreSQL.
//
// pgrelay's migrations and the worked example's schema (the ledger and the
// demo shop, internal/ledger/migrations) are applied once per server into a
// template database whose name carries a hash of both sets of files; every test then gets a clone of
// that template (CREATE DATABASE ... TEMPLATE), which takes a few milliseconds,
// so tests run in parallel without sharing state.
package testdb

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"

	ledgermigrations "github.com/pgrelay/pgrelay/internal/ledger/migrations"
	"github.com/pgrelay/pgrelay/internal/pgurl"
	"github.com/pgrelay/pgrelay/migrations"
)

// DefaultPostgresImage is the image started when PGRELAY_POSTGRES_IMAGE is
// unset: the official one, as docker-compose.yml uses.
const DefaultPostgresImage = "postgres:16-alpine"

// server is resolved once per test binary: starting a container or building the
// template database is too slow to repeat per test.
var server struct {
	once      sync.Once
	url       string
	template  string
	err       error
	skip      string
	origin    string
	container *tcpostgres.PostgresContainer
}

// New returns a pool connected to a fresh database, migrated with pgrelay's
// migrations and the example schema, that is dropped when the test ends.
func New(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	u := NewURL(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		tb.Fatalf("testdb: connect: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// NewURL creates a fresh, migrated database and returns its connection string,
// for tests that hand the database to a subprocess. The database is dropped
// when the test ends.
func NewURL(tb testing.TB) string {
	tb.Helper()
	base, template := resolve(tb)
	return create(tb, base, " TEMPLATE "+pgx.Identifier{template}.Sanitize())
}

// EmptyURL creates a fresh database without any migration (for tests of the
// migrations themselves) and returns its connection string. The database is
// dropped when the test ends.
func EmptyURL(tb testing.TB) string {
	tb.Helper()
	base, _ := resolve(tb)
	return create(tb, base, "")
}

// create creates a database on base's server (CREATE DATABASE name+options),
// dropped when the test ends, and returns its URL.
func create(tb testing.TB, base, options string) string {
	tb.Helper()
	name := "pgrelay_t_" + randomSuffix()

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		tb.Fatalf("testdb: connect to %s: %v", pgurl.Redact(base), err)
	}
	defer admin.Close(context.Background())

	for attempt := 0; ; attempt++ {
		_, err = admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+options)
		var pgErr *pgconn.PgError
		// 55006: the template is briefly in use by another clone; retry.
		if err != nil && errors.As(err, &pgErr) && pgErr.Code == "55006" && attempt < 100 {
			time.Sleep(time.Duration(10+attempt) * time.Millisecond)
			continue
		}
		break
	}
	if err != nil {
		tb.Fatalf("testdb: create database: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			tb.Logf("testdb: drop %s: %v", name, err)
			return
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", pgx.Identifier{name}.Sanitize())); err != nil {
			tb.Logf("testdb: drop %s: %v", name, err)
		}
	})
	return pgurl.WithDatabase(base, name)
}

// ServerURL returns the URL of the server the tests use (its maintenance
// database), for tests that need more than one database or a raw connection.
func ServerURL(tb testing.TB) string {
	tb.Helper()
	base, _ := resolve(tb)
	return base
}

func resolve(tb testing.TB) (base, template string) {
	tb.Helper()
	server.once.Do(func() {
		server.url, server.skip, server.err = findServer()
		if server.err == nil && server.skip == "" {
			server.template, server.err = ensureTemplate(server.url)
		}
		if server.container != nil && server.err == nil && server.skip == "" {
			tb.Logf("testdb: %s", server.origin)
		}
	})
	switch {
	case server.err != nil:
		tb.Fatalf("testdb: %v", server.err)
	case server.skip != "" && os.Getenv("CI") != "":
		tb.Fatalf("testdb: no PostgreSQL for the tests under CI: %s", server.skip)
	case server.skip != "":
		tb.Skipf("testdb: %s", server.skip)
	}
	return server.url, server.template
}

func findServer() (u, skip string, err error) {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		server.origin = "TEST_DATABASE_URL " + pgurl.Redact(u)
		return u, "", nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	image := os.Getenv("PGRELAY_POSTGRES_IMAGE")
	if image == "" {
		image = DefaultPostgresImage
	}
	// The container lives as long as the test binary: testcontainers' reaper
	// removes it afterwards, or Terminate when the reaper is disabled.
	c, err := tcpostgres.Run(ctx, image,
		tcpostgres.WithDatabase("postgres"),
		tcpostgres.WithUsername("postgres"),
		tcpostgres.WithPassword("postgres"),
		tcpostgres.BasicWaitStrategies(),
	)
	if c != nil {
		server.container = c
	}
	if err != nil {
		return "", "set TEST_DATABASE_URL (for example postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable) or run a Docker engine for testcontainers (" + image + ": " + firstLine(err.Error()) + ")", nil
	}
	u, err = c.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		return "", "", fmt.Errorf("container connection string: %w", err)
	}
	server.origin = fmt.Sprintf("PostgreSQL container %.12s from image %s at %s", c.GetContainerID(), image, pgurl.Redact(u))
	return u, "", nil
}

// Origin says where the test's server came from: "TEST_DATABASE_URL <url>" or
// "PostgreSQL container <id> from image <image> at <url>" (passwords redacted).
func Origin(tb testing.TB) string {
	tb.Helper()
	resolve(tb)
	return server.origin
}

// FromContainer reports whether the server is a container this test binary
// started.
func FromContainer(tb testing.TB) bool {
	tb.Helper()
	resolve(tb)
	return server.container != nil
}

// Terminate removes the container the test binary started, if any. Call it
// from TestMain after m.Run when testcontainers' reaper is disabled
// (TESTCONTAINERS_RYUK_DISABLED=true, as on machines without a registry to
// pull the reaper from).
func Terminate() error {
	if server.container == nil {
		return nil
	}
	return testcontainers.TerminateContainer(server.container)
}

// ensureTemplate builds the migrated template database once per server and
// migration set. Test binaries run in parallel, so the build is serialized by
// an advisory lock, and the template only gets its final name once complete.
func ensureTemplate(base string) (string, error) {
	sum, err := migrationsHash()
	if err != nil {
		return "", err
	}
	name := "pgrelay_tmpl_" + sum
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		return "", fmt.Errorf("connect to %s: %w", pgurl.Redact(base), err)
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(ctx, "SELECT pg_advisory_lock(727274)"); err != nil {
		return "", fmt.Errorf("template lock: %w", err)
	}
	defer admin.Exec(context.Background(), "SELECT pg_advisory_unlock(727274)") //nolint:errcheck

	var exists bool
	if err := admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return "", fmt.Errorf("look up template: %w", err)
	}
	if exists {
		return name, nil
	}
	building := name + "_build"
	if _, err := admin.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", pgx.Identifier{building}.Sanitize())); err != nil {
		return "", fmt.Errorf("drop stale template: %w", err)
	}
	if _, err := admin.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s", pgx.Identifier{building}.Sanitize())); err != nil {
		return "", fmt.Errorf("create template: %w", err)
	}
	if err := migrate(ctx, pgurl.WithDatabase(base, building)); err != nil {
		return "", err
	}
	if _, err := admin.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s RENAME TO %s", pgx.Identifier{building}.Sanitize(), pgx.Identifier{name}.Sanitize())); err != nil {
		return "", fmt.Errorf("rename template: %w", err)
	}
	return name, nil
}

func migrate(ctx context.Context, u string) error {
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		return fmt.Errorf("connect to template: %w", err)
	}
	defer pool.Close()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	if err := migrations.Up(ctx, db); err != nil {
		return fmt.Errorf("migrate template: %w", err)
	}
	if err := ledgermigrations.Up(ctx, db); err != nil {
		return fmt.Errorf("migrate template: %w", err)
	}
	return nil
}

// migrationsHash hashes both migration sets the template applies.
func migrationsHash() (string, error) {
	h := sha256.New()
	for _, set := range []struct {
		name string
		fsys fs.FS
	}{{"pgrelay", migrations.FS}, {"example", ledgermigrations.FS}} {
		names, err := fs.Glob(set.fsys, "*.sql")
		if err != nil {
			return "", err
		}
		sort.Strings(names)
		for _, n := range names {
			b, err := fs.ReadFile(set.fsys, n)
			if err != nil {
				return "", err
			}
			fmt.Fprintf(h, "%s/%s\x00%d\x00", set.name, n, len(b))
			h.Write(b)
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

func randomSuffix() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
