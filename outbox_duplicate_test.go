package pgrelay_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// TestEnqueueDuplicateKeepsCallerTx shows the idempotent producer: enqueueing
// an event id again returns ErrDuplicateEvent for an identical message and
// ErrEventIDConflict for a different one, writes nothing twice, and leaves the
// caller's transaction usable, so its business rows still commit.
func TestEnqueueDuplicateKeepsCallerTx(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := pool.Exec(ctx, `CREATE TABLE business (n int PRIMARY KEY)`)
	require.NoError(t, err)
	o, err := pgrelay.NewOutbox(pgrelay.OutboxConfig{})
	require.NoError(t, err)

	first := pgrelay.Message{EventID: "pay-1", Topic: "payments", Key: "order-7", EventType: "PaymentRequested",
		Payload: []byte(`{"amount":100}`), Headers: map[string]string{"a": "1", "b": "2"}}
	require.NoError(t, enqueue(t, pool, o, first))

	same := first
	same.Headers = map[string]string{"b": "2", "a": "1"}
	same.OccurredAt = time.Now().Add(time.Hour) // not part of identity

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	_, err = tx.Exec(ctx, `INSERT INTO business VALUES (1)`)
	require.NoError(t, err)
	err = o.Enqueue(ctx, tx, same, pgrelay.Message{EventID: "pay-2", Topic: "payments", Key: "order-7"})
	require.ErrorIs(t, err, pgrelay.ErrDuplicateEvent)
	require.NotErrorIs(t, err, pgrelay.ErrEventIDConflict)
	// The transaction survived the duplicate: more work and the commit succeed.
	_, err = tx.Exec(ctx, `INSERT INTO business VALUES (2)`)
	require.NoError(t, err, "the caller's transaction must not be aborted by a duplicate")
	require.NoError(t, tx.Commit(ctx))

	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM business`).Scan(&n))
	require.Equal(t, 2, n)
	got := rows(t, pool)
	require.Len(t, got, 2, "pay-1 once, pay-2 written beside the duplicate")
	require.Equal(t, "pay-1", got[0].EventID)
	require.Equal(t, "pay-2", got[1].EventID)

	// Each identity field, changed alone, is a conflict.
	for name, change := range map[string]func(*pgrelay.Message){
		"topic":   func(m *pgrelay.Message) { m.Topic = "payments.v2" },
		"key":     func(m *pgrelay.Message) { m.Key = "order-8" },
		"no key":  func(m *pgrelay.Message) { m.Key = "" },
		"type":    func(m *pgrelay.Message) { m.EventType = "PaymentRefunded" },
		"payload": func(m *pgrelay.Message) { m.Payload = []byte(`{"amount": 100}`) },
		"headers": func(m *pgrelay.Message) { m.Headers = map[string]string{"a": "1"} },
	} {
		m := first
		change(&m)
		err := enqueue(t, pool, o, m)
		require.ErrorIs(t, err, pgrelay.ErrEventIDConflict, name)
		require.NotErrorIs(t, err, pgrelay.ErrDuplicateEvent, name)
	}
	// A conflict beside a duplicate reports only the conflict.
	diff := first
	diff.Payload = []byte(`{"amount":999}`)
	err = enqueue(t, pool, o, first, diff)
	require.ErrorIs(t, err, pgrelay.ErrEventIDConflict)
	require.NotErrorIs(t, err, pgrelay.ErrDuplicateEvent)
	require.Len(t, rows(t, pool), 2, "nothing written twice")
}

// TestEnqueueRepeatedIDInOneCall: the second copy of an id within one call is
// compared with the first, which the same statement wrote.
func TestEnqueueRepeatedIDInOneCall(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	o, err := pgrelay.NewOutbox(pgrelay.OutboxConfig{})
	require.NoError(t, err)
	m := pgrelay.Message{EventID: "e-1", Topic: "t", Payload: []byte("x")}
	err = enqueue(t, pool, o, m, m)
	require.True(t, errors.Is(err, pgrelay.ErrDuplicateEvent), "got %v", err)
	require.Len(t, rows(t, pool), 0, "enqueue's helper rolls back on error")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		err := o.Enqueue(ctx, tx, m, m)
		if errors.Is(err, pgrelay.ErrDuplicateEvent) {
			return nil // commit: the first copy is written
		}
		return err
	}))
	require.Len(t, rows(t, pool), 1)
}

// TestPlainSQLDuplicateContract documents what a plain-SQL producer sees: a
// second INSERT of an event id raises unique_violation (23505) on
// outbox_event_id_key, which aborts its transaction; ON CONFLICT (event_id)
// DO NOTHING makes the insert idempotent and keeps the transaction usable.
func TestPlainSQLDuplicateContract(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const ins = `INSERT INTO pgrelay.outbox (event_id, topic, payload) VALUES ('p-1', 'orders', '\x01')`
	_, err := pool.Exec(ctx, ins)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, ins)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "23505", pgErr.Code)
	require.Equal(t, "outbox_event_id_key", pgErr.ConstraintName)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	tag, err := tx.Exec(ctx, ins+` ON CONFLICT (event_id) DO NOTHING`)
	require.NoError(t, err)
	require.EqualValues(t, 0, tag.RowsAffected(), "0 rows: the id was already there")
	_, err = tx.Exec(ctx, `SELECT 1`)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
}
