package migrations_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/testdb"
)

// TestOutboxRowRulesRefuseAsConstraints: the outbox's row rules, checked by
// its triggers since 00112 instead of CHECK constraints, refuse a plain-SQL
// insert or update exactly as the constraints did (SQLSTATE 23514, the
// constraint's name in the error's field and message), a NULL trace context
// passes, a requeue of a dead row stored before a rule with a value the rule
// refuses is refused, and marking that row published or dead is not.
func TestOutboxRowRulesRefuseAsConstraints(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool := testdb.New(t)

	refused := func(t *testing.T, constraint, sql string, args ...any) {
		t.Helper()
		_, err := pool.Exec(ctx, sql, args...)
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), "%s: %v", sql, err)
		require.Equal(t, "23514", pgErr.Code, sql)
		require.Equal(t, constraint, pgErr.ConstraintName, sql)
		require.Equal(t, "outbox", pgErr.TableName, sql)
		require.Contains(t, pgErr.Message, `violates check constraint "`+constraint+`"`, sql)
	}
	const ins = `INSERT INTO pgrelay.outbox (event_id, topic, key, payload, occurred_at, traceparent, tracestate) VALUES ($1, $2, $3, '\x', $4, $5, $6)`
	ok := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	refused(t, "outbox_event_id_check", ins, "", "orders", "k", ok, nil, nil)
	refused(t, "outbox_event_id_check", ins, strings.Repeat("e", 256), "orders", "k", ok, nil, nil)
	refused(t, "outbox_key_length", ins, "e-key", "orders", strings.Repeat("k", 1025), ok, nil, nil)
	refused(t, "outbox_occurred_at_range", ins, "e-at", "orders", "k", time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), nil, nil)
	refused(t, "outbox_topic_check", ins, "e-empty", "", "k", ok, nil, nil)
	refused(t, "outbox_topic_valid", ins, "e-wild", "orders.*", "k", ok, nil, nil)
	refused(t, "outbox_topic_valid", ins, "e-long", strings.Repeat("t", 256), "k", ok, nil, nil)
	refused(t, "outbox_trace_context_length", ins, "e-tp", "orders", "k", ok, strings.Repeat("p", 256), nil)
	refused(t, "outbox_trace_context_length", ins, "e-ts", "orders", "k", ok, nil, strings.Repeat("s", 4097))
	// Every rule in one COPY, the other way rows arrive without Enqueue.
	_, err := pool.CopyFrom(ctx, pgx.Identifier{"pgrelay", "outbox"}, []string{"event_id", "topic", "payload"},
		pgx.CopyFromRows([][]any{{"c-1", "a b", []byte{}}}))
	require.ErrorContains(t, err, "outbox_topic_valid")

	// Limits themselves pass; an absent trace context passes.
	_, err = pool.Exec(ctx, ins, strings.Repeat("e", 255), strings.Repeat("t", 255), strings.Repeat("k", 1024), ok, strings.Repeat("p", 255), strings.Repeat("s", 4096))
	require.NoError(t, err)
	_, err = pool.Exec(ctx, ins, "e-ok", "orders.created", "k", ok, nil, nil)
	require.NoError(t, err)

	// Updates: a changed column is checked, so is a status outside the three.
	refused(t, "outbox_topic_valid", `UPDATE pgrelay.outbox SET topic = 'a b' WHERE event_id = 'e-ok'`)
	refused(t, "outbox_key_length", `UPDATE pgrelay.outbox SET key = repeat('k', 1025) WHERE event_id = 'e-ok'`)
	refused(t, "outbox_status_check", `UPDATE pgrelay.outbox SET status = 'done' WHERE event_id = 'e-ok'`)
	refused(t, "outbox_trace_context_length", `UPDATE pgrelay.outbox SET tracestate = repeat('s', 4097) WHERE event_id = 'e-ok'`)

	// A row stored before the topic rule (its triggers off for the update
	// that gives it the old topic), dead: marking it is let through, a
	// requeue is refused naming the rule.
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE pgrelay.outbox SET topic = 'x y' WHERE event_id = 'e-ok'`)
		return err
	}))
	_, err = pool.Exec(ctx, `UPDATE pgrelay.outbox SET status = 'dead', attempts = attempts + 1, last_error = 'invalid subject' WHERE event_id = 'e-ok'`)
	require.NoError(t, err, "the relay's mark is not refused")
	refused(t, "outbox_topic_valid", `UPDATE pgrelay.outbox SET status = 'pending', attempts = 0 WHERE event_id = 'e-ok'`)
	_, err = pool.Exec(ctx, `UPDATE pgrelay.outbox SET status = 'published', published_at = now() WHERE event_id = 'e-ok'`)
	require.NoError(t, err)
}
