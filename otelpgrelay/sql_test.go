package otelpgrelay_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/otelpgrelay"
)

// TestPlainSQLProducerTraceContext: a producer writing SQL sets the outbox's
// traceparent and tracestate columns itself; the handler's process span
// joins that trace and sees the trace state. The columns' length check
// refuses what no broker header should carry.
func TestPlainSQLProducerTraceContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool := testdb.New(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	e := natsEnv(t, ctx, pool)
	runs := pipeline(t, ctx, pool, e, otelpgrelay.WithTracerProvider(tp), otelpgrelay.WithSystem(e.system))

	const tp1 = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	_, err := pool.Exec(ctx, `INSERT INTO pgrelay.outbox (event_id, topic, event_type, payload, traceparent, tracestate)
		VALUES ('sql-1', 'orders', 'OrderPlaced', '\x7b7d', $1, 'congo=t61rcWkgMzE')`, tp1)
	require.NoError(t, err)
	for range 2 {
		run := nextRun(t, runs)
		require.Equal(t, "0af7651916cd43dd8448eb211c80319c", run.sc.TraceID().String())
		require.Equal(t, tp1, run.ev.TraceParent)
		require.Equal(t, "congo=t61rcWkgMzE", run.ev.TraceState)
		require.Equal(t, "congo=t61rcWkgMzE", run.sc.TraceState().String())
	}

	var pgErr *pgconn.PgError
	_, err = pool.Exec(ctx, `INSERT INTO pgrelay.outbox (topic, event_type, payload, traceparent) VALUES ('orders', 'X', '', $1)`, strings.Repeat("a", 256))
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "outbox_trace_context_length", pgErr.ConstraintName)
	_, err = pool.Exec(ctx, `INSERT INTO pgrelay.outbox (topic, event_type, payload, tracestate) VALUES ('orders', 'X', '', $1)`, strings.Repeat("a", 4097))
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "outbox_trace_context_length", pgErr.ConstraintName)
}
