package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/postgres"
)

// postgresTarget is PostgreSQL as the broker: a fresh target database (a
// clone of the migrated template, on the same server as the outbox) with
// one registered handler; the relays store into its inbox.
type postgresTarget struct {
	b    *bench
	url  string
	pool *pgxpool.Pool
}

func newPostgresTarget(ctx context.Context, b *bench) (relayTarget, error) {
	pool, url, err := b.dbs.fresh(ctx, 2)
	if err != nil {
		return nil, err
	}
	if err := postgres.Register(ctx, pool, postgres.Subscription{}); err != nil {
		pool.Close()
		return nil, err
	}
	return &postgresTarget{b: b, url: url, pool: pool}, nil
}

func (t *postgresTarget) newPublisher(ctx context.Context) (broker.Publisher, error) {
	p, err := postgres.NewPublisher(ctx, postgres.Config{URL: t.url, Logger: t.b.log.With(slog.String("logger", "postgres"))})
	if err != nil {
		return nil, fmt.Errorf("target database: %w", err)
	}
	return p, nil
}

func (t *postgresTarget) stored(ctx context.Context) (uint64, error) {
	var n uint64
	err := t.pool.QueryRow(ctx, `SELECT count(*) FROM pgrelay.inbox`).Scan(&n)
	return n, err
}

func (t *postgresTarget) drop() { t.pool.Close() }
