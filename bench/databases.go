package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	ledgermigrations "github.com/pgrelay/pgrelay/internal/ledger/migrations"
	"github.com/pgrelay/pgrelay/internal/pgurl"
	"github.com/pgrelay/pgrelay/migrations"
)

// databases creates the run's databases on one server and drops them all at
// the end. The migrations are applied once into a template database; every
// measurement then gets a clone of it, so each starts from empty tables.
type databases struct {
	adminURL string
	prefix   string
	template string
	log      *slog.Logger
	// postmaster is the server's postmaster in /proc, for its CPU time; 0
	// when it is not on this machine (postmasterErr says why).
	postmaster    int
	postmasterErr string
	// commitTS reports track_commit_timestamp = on.
	commitTS bool

	mu      sync.Mutex
	n       int
	created []string
}

func newDatabases(ctx context.Context, adminURL string, log *slog.Logger) (*databases, error) {
	d := &databases{adminURL: adminURL, prefix: "pgrelay_bench_" + randomHex(4), log: log}
	d.template = d.prefix + "_tmpl"
	if err := d.exec(ctx, fmt.Sprintf("CREATE DATABASE %s", ident(d.template))); err != nil {
		return nil, fmt.Errorf("create template database: %w", err)
	}
	d.created = append(d.created, d.template)
	if err := d.probe(ctx); err != nil {
		return d, err
	}
	pool, err := d.open(ctx, d.template, 2)
	if err != nil {
		return d, err
	}
	defer pool.Close()
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()
	if err := migrations.Up(ctx, sqlDB); err != nil {
		return d, fmt.Errorf("migrate template database: %w", err)
	}
	// The example schema: the ledger the consumer credits, the demo shop.
	if err := ledgermigrations.Up(ctx, sqlDB); err != nil {
		return d, fmt.Errorf("migrate template database: %w", err)
	}
	return d, nil
}

// probe finds the server's postmaster in /proc and reads
// track_commit_timestamp.
func (d *databases) probe(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, d.adminURL)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", pgurl.Redact(d.adminURL), err)
	}
	defer conn.Close(context.Background())
	var commitTS string
	if err := conn.QueryRow(ctx, "SHOW track_commit_timestamp").Scan(&commitTS); err != nil {
		return fmt.Errorf("track_commit_timestamp: %w", err)
	}
	d.commitTS = commitTS == "on"
	if d.postmaster, err = findPostmaster(ctx, conn); err != nil {
		if ctx.Err() != nil {
			return err
		}
		d.postmasterErr = err.Error()
	}
	return nil
}

// fresh creates a new migrated database and returns a pool of at most
// maxConns connections to it, and its URL (for processes).
func (d *databases) fresh(ctx context.Context, maxConns int) (*pgxpool.Pool, string, error) {
	d.mu.Lock()
	d.n++
	name := fmt.Sprintf("%s_%d", d.prefix, d.n)
	d.mu.Unlock()
	var err error
	for attempt := 0; attempt < 50; attempt++ {
		err = d.exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", ident(name), ident(d.template)))
		var pgErr *pgconn.PgError
		// 55006: the template is briefly in use (a previous clone); retry.
		if err != nil && errors.As(err, &pgErr) && pgErr.Code == "55006" {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		break
	}
	if err != nil {
		return nil, "", fmt.Errorf("create database %s: %w", name, err)
	}
	d.mu.Lock()
	d.created = append(d.created, name)
	d.mu.Unlock()
	pool, err := d.open(ctx, name, maxConns)
	if err != nil {
		return nil, "", err
	}
	return pool, pgurl.WithDatabase(d.adminURL, name), nil
}

func (d *databases) open(ctx context.Context, name string, maxConns int) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(pgurl.WithDatabase(d.adminURL, name))
	if err != nil {
		return nil, fmt.Errorf("parse database URL: %w", err)
	}
	cfg.MaxConns = int32(maxConns)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", name, err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to %s: %w", name, err)
	}
	return pool, nil
}

// dropAll drops every database the run created. It uses its own context so
// that it still runs when the run was interrupted.
func (d *databases) dropAll() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d.mu.Lock()
	names := append([]string(nil), d.created...)
	d.created = nil
	d.mu.Unlock()
	for i := len(names) - 1; i >= 0; i-- {
		if err := d.exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", ident(names[i]))); err != nil {
			d.log.Warn("drop database", slog.String("database", names[i]), slog.Any("error", err))
		}
	}
}

func (d *databases) exec(ctx context.Context, sql string) error {
	conn, err := pgx.Connect(ctx, d.adminURL)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", pgurl.Redact(d.adminURL), err)
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql)
	return err
}

func ident(name string) string { return pgx.Identifier{name}.Sanitize() }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
