package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// sqlTrace counts the statements a pool sends (each one round trip; a pgx
// batch counts as one) and the time from sending each to its end, by kind:
// the first words of its text,
// or the sqlc query name a generated statement starts with. With -sql-trace,
// the in-process services' pools carry one each, and the run prints them
// per end-to-end run: round trips per batch (statements per COMMIT) are
// independent of the machine's load.
type sqlTrace struct {
	name string
	mu   sync.Mutex
	by   map[string]*sqlKind
}

type sqlKind struct {
	n     int
	total time.Duration
}

type traceStart struct{}

func newSQLTrace(name string) *sqlTrace { return &sqlTrace{name: name, by: map[string]*sqlKind{}} }

// attach makes cfg's connections report to t.
func (t *sqlTrace) attach(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = t }

func (t *sqlTrace) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, traceStart{}, [2]any{time.Now(), sqlKindOf(data.SQL)})
}

func (t *sqlTrace) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	v, ok := ctx.Value(traceStart{}).([2]any)
	if !ok {
		return
	}
	d := time.Since(v[0].(time.Time))
	kind := v[1].(string)
	t.mu.Lock()
	k := t.by[kind]
	if k == nil {
		k = &sqlKind{}
		t.by[kind] = k
	}
	k.n++
	k.total += d
	t.mu.Unlock()
}

// TraceBatchStart counts a batch (pgx SendBatch, its statements pipelined
// in one round trip) as one statement, named by its statements' kinds
// joined with "+": "batch savepoint pgrelay_apply_on_receive+InsertInbox".
func (t *sqlTrace) TraceBatchStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	kinds := make([]string, 0, data.Batch.Len())
	for _, q := range data.Batch.QueuedQueries {
		kinds = append(kinds, sqlKindOf(q.SQL))
	}
	return context.WithValue(ctx, traceStart{}, [2]any{time.Now(), "batch " + strings.Join(kinds, "+")})
}

func (t *sqlTrace) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (t *sqlTrace) TraceBatchEnd(ctx context.Context, conn *pgx.Conn, _ pgx.TraceBatchEndData) {
	t.TraceQueryEnd(ctx, conn, pgx.TraceQueryEndData{})
}

// sqlKindOf names a statement: "-- name: X" of sqlc, else its first two words.
func sqlKindOf(sql string) string {
	s := strings.TrimSpace(sql)
	if rest, ok := strings.CutPrefix(s, "-- name: "); ok {
		if f := strings.Fields(rest); len(f) > 0 {
			return f[0]
		}
	}
	f := strings.Fields(s)
	if len(f) > 2 {
		f = f[:2]
	}
	return strings.ToLower(strings.Join(f, " "))
}

// reset returns the counts so far and starts again.
func (t *sqlTrace) reset() string {
	t.mu.Lock()
	by := t.by
	t.by = map[string]*sqlKind{}
	t.mu.Unlock()
	commits := 0
	total := 0
	kinds := make([]string, 0, len(by))
	for k, v := range by {
		kinds = append(kinds, k)
		total += v.n
		if k == "commit" {
			commits = v.n
		}
	}
	slices.SortFunc(kinds, func(a, b string) int { return by[b].n - by[a].n })
	var sb strings.Builder
	fmt.Fprintf(&sb, "%s: %d statements, %d commits (%.1f statements per commit)\n", t.name, total, commits, float64(total)/float64(max(commits, 1)))
	for _, k := range kinds {
		v := by[k]
		fmt.Fprintf(&sb, "  %-34s %7d  mean %6.2f ms\n", k, v.n, float64(v.total)/float64(v.n)/1e6)
	}
	return sb.String()
}
