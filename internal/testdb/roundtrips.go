package testdb

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// RoundTrips is a pgx tracer (pgx.QueryTracer and pgx.BatchTracer) recording
// the round trips a pool's connections make: one per statement, named by its
// sqlc query name ("-- name: X") or its text, and one "batch" per pgx batch
// (its statements go together). Set it as the pool's ConnConfig.Tracer.
type RoundTrips struct {
	// Handler is set by a test while the handler under test runs: the
	// round trips made meanwhile are counted as the handler's.
	Handler atomic.Bool

	mu    sync.Mutex
	trips []string
	inH   int
}

func (c *RoundTrips) add(sql string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i := strings.Index(sql, "\n"); strings.HasPrefix(sql, "-- name: ") && i > 0 {
		sql = sql[:i]
	}
	c.trips = append(c.trips, sql)
	if c.Handler.Load() {
		c.inH++
	}
}

// TraceQueryStart records a statement.
func (c *RoundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.add(d.SQL)
	return ctx
}

// TraceQueryEnd does nothing.
func (c *RoundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TraceBatchStart records a batch.
func (c *RoundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.add("batch")
	return ctx
}

// TraceBatchQuery does nothing: a batch's statements share its round trip.
func (c *RoundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

// TraceBatchEnd does nothing.
func (c *RoundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// Reset forgets what was recorded and returns it: the round trips, and how
// many of them were made while Handler was set.
func (c *RoundTrips) Reset() (trips []string, inHandler int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	trips, inHandler = c.trips, c.inH
	c.trips, c.inH = nil, 0
	return trips, inHandler
}

// RoundTripPool returns a one-connection pool on a fresh database (NewURL)
// whose round trips the returned RoundTrips records, with the given query
// exec mode (0: pgx's default). One connection, so that its statement cache
// is warm after the first use.
func RoundTripPool(tb testing.TB, mode pgx.QueryExecMode) (*pgxpool.Pool, *RoundTrips) {
	tb.Helper()
	pcfg, err := pgxpool.ParseConfig(NewURL(tb))
	if err != nil {
		tb.Fatal(err)
	}
	if mode != 0 {
		pcfg.ConnConfig.DefaultQueryExecMode = mode
	}
	pcfg.MaxConns = 1
	trips := &RoundTrips{}
	pcfg.ConnConfig.Tracer = trips
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	return pool, trips
}
