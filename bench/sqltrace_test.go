package main

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestSQLTraceCountsABatchOnce: a pgx batch (its statements pipelined in one
// round trip) counts as one statement, named by its statements; without the
// batch tracer it was not counted at all.
func TestSQLTraceCountsABatchOnce(t *testing.T) {
	t.Parallel()
	tr := newSQLTrace("consumer")
	ctx := context.Background()
	b := &pgx.Batch{}
	b.Queue("SAVEPOINT pgrelay_apply_on_receive")
	b.Queue("-- name: InsertInbox :many\nWITH m AS (SELECT 1)")
	tr.TraceBatchEnd(tr.TraceBatchStart(ctx, nil, pgx.TraceBatchStartData{Batch: b}), nil, pgx.TraceBatchEndData{})
	tr.TraceQueryEnd(tr.TraceQueryStart(ctx, nil, pgx.TraceQueryStartData{SQL: "commit"}), nil, pgx.TraceQueryEndData{})
	out := tr.reset()
	require.Contains(t, out, "consumer: 2 statements, 1 commits (2.0 statements per commit)")
	require.Contains(t, out, "batch savepoint pgrelay_apply_on_receive+InsertInbox")
}
