package testdb

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/db"
)

// ErrExplained is what a statement run through Explain returns instead of
// its rows.
var ErrExplained = errors.New("explained")

// Explain runs a generated statement under EXPLAIN (ANALYZE, BUFFERS) and
// keeps the plan instead of the rows, so that a test looks at the very SQL a
// service runs: pass it as the db.DBTX of a generated query, which then
// returns ErrExplained. EXPLAIN ANALYZE executes the statement: explain a
// write inside a transaction that is rolled back.
type Explain struct {
	db.DBTX
	// JSON is the plan, as EXPLAIN (FORMAT JSON) printed it.
	JSON []byte
}

func (e *Explain) explain(ctx context.Context, sql string, args []any) error {
	if err := e.DBTX.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+sql, args...).Scan(&e.JSON); err != nil {
		return err
	}
	return ErrExplained
}

// Query explains a statement that returns rows.
func (e *Explain) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return nil, e.explain(ctx, sql, args)
}

// Exec explains a statement that returns none (an :exec or :execrows).
func (e *Explain) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, e.explain(ctx, sql, args)
}

// QueryRow explains a statement that returns one row (a :one); the row's
// Scan returns ErrExplained.
func (e *Explain) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return explainedRow{err: e.explain(ctx, sql, args)}
}

// explainedRow is the row of a statement that was explained, not run.
type explainedRow struct{ err error }

func (r explainedRow) Scan(...any) error { return r.err }

// Root returns the plan's top node.
func (e *Explain) Root(t testing.TB) PlanNode {
	t.Helper()
	var plans []struct {
		Plan PlanNode `json:"Plan"`
	}
	require.NoError(t, json.Unmarshal(e.JSON, &plans), string(e.JSON))
	require.NotEmpty(t, plans, string(e.JSON))
	return plans[0].Plan
}

// PlanNode is one node of an EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) plan.
type PlanNode struct {
	NodeType   string     `json:"Node Type"`
	IndexName  string     `json:"Index Name"`
	ActualRows int        `json:"Actual Rows"`
	SharedHit  int        `json:"Shared Hit Blocks"`
	SharedRead int        `json:"Shared Read Blocks"`
	Plans      []PlanNode `json:"Plans"`
}

// Uses reports whether the node or any below it reads the index.
func (n PlanNode) Uses(index string) bool {
	if n.IndexName == index {
		return true
	}
	for _, c := range n.Plans {
		if c.Uses(index) {
			return true
		}
	}
	return false
}

// LargestScan returns the most rows any scan node at or below n produced
// (per loop, as EXPLAIN reports them).
func (n PlanNode) LargestScan() int {
	m := 0
	switch n.NodeType {
	case "Seq Scan", "Index Scan", "Index Only Scan", "Bitmap Heap Scan", "Bitmap Index Scan":
		m = n.ActualRows
	}
	for _, c := range n.Plans {
		m = max(m, c.LargestScan())
	}
	return m
}
