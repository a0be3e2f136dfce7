// Package exampleenv gives a package's runnable Example functions, which
// cannot take a *testing.T, what they need to run and have their output
// checked: a migrated database of their own in DATABASE_URL (with the
// application tables the examples write to) and, when asked, a NATS server
// with JetStream in NATS_URL. Without TEST_DATABASE_URL the examples are
// skipped, like the other database tests without a server.
package exampleenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgrelay/pgrelay/internal/natsserver"
	"github.com/pgrelay/pgrelay/internal/pgurl"
	"github.com/pgrelay/pgrelay/migrations"
)

// Main is a package's TestMain: it prepares the examples' environment, runs
// the tests and exits with their code. withNATS also starts an in-process
// NATS server unless NATS_URL is set.
func Main(m *testing.M, withNATS bool) {
	flag.Parse()
	base := os.Getenv("TEST_DATABASE_URL")
	if base == "" {
		fmt.Fprintln(os.Stderr, "pgrelay: examples skipped: set TEST_DATABASE_URL to run them")
		_ = flag.Set("test.skip", "^Example")
		os.Exit(m.Run())
	}
	drop, err := database(base)
	if err != nil {
		fmt.Fprintln(os.Stderr, "pgrelay: example database:", err)
		os.Exit(1)
	}
	stopNATS := func() {}
	if withNATS {
		if stopNATS, err = startNATS(); err != nil {
			drop()
			fmt.Fprintln(os.Stderr, "pgrelay: example NATS:", err)
			os.Exit(1)
		}
	}
	code := m.Run()
	stopNATS()
	drop()
	os.Exit(code)
}

// startNATS points NATS_URL at an in-process NATS server with JetStream
// unless it is set already.
func startNATS() (stop func(), err error) {
	if os.Getenv("NATS_URL") != "" {
		return func() {}, nil
	}
	dir, err := os.MkdirTemp("", "pgrelay-example-nats")
	if err != nil {
		return nil, err
	}
	srv, u, err := natsserver.Start(natsserver.Config{StoreDir: dir, Listen: "127.0.0.1:0"})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if err := os.Setenv("NATS_URL", u); err != nil {
		srv.Shutdown()
		return nil, err
	}
	return func() {
		srv.Shutdown()
		srv.WaitForShutdown()
		_ = os.RemoveAll(dir)
	}, nil
}

// database creates and migrates a database for the examples, with the
// application tables they use, and points DATABASE_URL at it.
func database(base string) (drop func(), err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "pgrelay_examples_" + hex.EncodeToString(b)
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		return nil, err
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return nil, err
	}
	drop = func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if c, err := pgx.Connect(ctx, base); err == nil {
			_, _ = c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
			_ = c.Close(ctx)
		}
	}
	u := pgurl.WithDatabase(base, name)
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		drop()
		return nil, err
	}
	defer pool.Close()
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()
	if err := migrations.Up(ctx, sqlDB); err != nil {
		drop()
		return nil, err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (order_id text PRIMARY KEY);
		CREATE TABLE payments (event_id text PRIMARY KEY, order_id text NOT NULL, amount_cents bigint NOT NULL)`); err != nil {
		drop()
		return nil, err
	}
	if err := os.Setenv("DATABASE_URL", u); err != nil {
		drop()
		return nil, err
	}
	return drop, nil
}
