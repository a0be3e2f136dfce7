package outbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/outbox"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// keySeqs returns each event's key sequence (0: none), by event id.
func keySeqs(t *testing.T, pool *pgxpool.Pool) map[string]int64 {
	t.Helper()
	rs, err := pool.Query(context.Background(), `SELECT event_id, coalesce(key_seq, 0) FROM outbox`)
	require.NoError(t, err)
	out := map[string]int64{}
	for rs.Next() {
		var id string
		var seq int64
		require.NoError(t, rs.Scan(&id, &seq))
		out[id] = seq
	}
	require.NoError(t, rs.Err())
	return out
}

// TestKeySeqContiguousPerKey: the events of one explicit key are numbered 1,
// 2, 3, ... in commit order; a rolled-back producer, an idempotent retry and a
// plain-SQL value leave no hole and no double; events without a key (or keyed
// by their own id) carry none.
func TestKeySeqContiguousPerKey(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	o, err := outbox.New(outbox.Config{})
	require.NoError(t, err)
	msg := func(id, key string) event.Message {
		return event.Message{EventID: id, Topic: "orders", Key: key, EventType: "T", Payload: []byte(`{}`)}
	}
	require.NoError(t, enqueue(t, pool, o, msg("a1", "a"), msg("b1", "b"), msg("a2", "a")))
	require.NoError(t, enqueue(t, pool, o, msg("free", ""), msg("self", "self")))

	// A producer that rolls back gives its numbers back.
	ctx := context.Background()
	boom := errors.New("rollback")
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := o.Enqueue(ctx, tx, msg("a-rolled-back", "a")); err != nil {
			return err
		}
		return boom
	})
	require.ErrorIs(t, err, boom)
	// An idempotent retry of a stored event takes no number, even when the
	// producer commits after it (a duplicate is success to a retrying one).
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		err := o.Enqueue(ctx, tx, msg("a2", "a"))
		require.ErrorIs(t, err, outbox.ErrDuplicateEvent)
		return nil
	}))
	require.NoError(t, enqueue(t, pool, o, msg("a3", "a")))
	// Plain SQL: the trigger numbers it, whatever the producer wrote.
	_, err = pool.Exec(ctx, `INSERT INTO outbox (event_id, topic, key, key_seq) VALUES ('b2', 'orders', 'b', 99)`)
	require.NoError(t, err)

	require.Equal(t, map[string]int64{"a1": 1, "a2": 2, "a3": 3, "b1": 1, "b2": 2, "free": 0, "self": 0}, keySeqs(t, pool))

	// Retention deleting a key's rows does not restart its numbering.
	_, err = pool.Exec(ctx, `DELETE FROM outbox WHERE key = 'a'`)
	require.NoError(t, err)
	require.NoError(t, enqueue(t, pool, o, msg("a4", "a")))
	require.EqualValues(t, 4, keySeqs(t, pool)["a4"])
}
