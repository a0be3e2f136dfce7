package pgrelay_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// keySeqs returns each event's key sequence (0: none), by event id.
func keySeqs(t *testing.T, pool *pgxpool.Pool) map[string]int64 {
	t.Helper()
	rs, err := pool.Query(context.Background(), `SELECT event_id, coalesce(key_seq, 0) FROM pgrelay.outbox`)
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
// by their own id) carry none. Under each isolation level: a READ COMMITTED
// producer takes its number from the outbox and the counter alone, the others
// also write the key's counter (00090).
func TestKeySeqContiguousPerKey(t *testing.T) {
	t.Parallel()
	for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable} {
		t.Run(string(iso), func(t *testing.T) {
			t.Parallel()
			testKeySeqContiguousPerKey(t, pgx.TxOptions{IsoLevel: iso})
		})
	}
}

func testKeySeqContiguousPerKey(t *testing.T, opts pgx.TxOptions) {
	pool := testdb.New(t)
	ctx := context.Background()
	enqueue := func(t *testing.T, pool *pgxpool.Pool, o *pgrelay.Outbox, msgs ...pgrelay.Message) error {
		t.Helper()
		return pgx.BeginTxFunc(ctx, pool, opts, func(tx pgx.Tx) error { return o.Enqueue(ctx, tx, msgs...) })
	}
	o, err := pgrelay.NewOutbox(pgrelay.OutboxConfig{})
	require.NoError(t, err)
	msg := func(id, key string) pgrelay.Message {
		return pgrelay.Message{EventID: id, Topic: "orders", Key: key, EventType: "T", Payload: []byte(`{}`)}
	}
	require.NoError(t, enqueue(t, pool, o, msg("a1", "a"), msg("b1", "b"), msg("a2", "a")))
	require.NoError(t, enqueue(t, pool, o, msg("free", ""), msg("self", "self")))

	// A producer that rolls back gives its numbers back.
	boom := errors.New("rollback")
	err = pgx.BeginTxFunc(ctx, pool, opts, func(tx pgx.Tx) error {
		if err := o.Enqueue(ctx, tx, msg("a-rolled-back", "a")); err != nil {
			return err
		}
		return boom
	})
	require.ErrorIs(t, err, boom)
	// An idempotent retry of a stored event takes no number, even when the
	// producer commits after it (a duplicate is success to a retrying one).
	require.NoError(t, pgx.BeginTxFunc(ctx, pool, opts, func(tx pgx.Tx) error {
		err := o.Enqueue(ctx, tx, msg("a2", "a"))
		require.ErrorIs(t, err, pgrelay.ErrDuplicateEvent)
		return nil
	}))
	require.NoError(t, enqueue(t, pool, o, msg("a3", "a")))
	// Plain SQL: the trigger numbers it, whatever the producer wrote.
	_, err = pool.Exec(ctx, `INSERT INTO pgrelay.outbox (event_id, topic, key, key_seq) VALUES ('b2', 'orders', 'b', 99)`)
	require.NoError(t, err)

	require.Equal(t, map[string]int64{"a1": 1, "a2": 2, "a3": 3, "b1": 1, "b2": 2, "free": 0, "self": 0}, keySeqs(t, pool))

	// Retention deleting a key's rows does not restart its numbering.
	_, err = pool.Exec(ctx, `DELETE FROM pgrelay.outbox WHERE key = 'a'`)
	require.NoError(t, err)
	require.NoError(t, enqueue(t, pool, o, msg("a4", "a")))
	require.EqualValues(t, 4, keySeqs(t, pool)["a4"])

	// Many events of one key in one transaction, one of them in a
	// savepoint, and a rolled-back savepoint: contiguous.
	require.NoError(t, pgx.BeginTxFunc(ctx, pool, opts, func(tx pgx.Tx) error {
		if err := o.Enqueue(ctx, tx, msg("c1", "c"), msg("c2", "c"), msg("c3", "c")); err != nil {
			return err
		}
		if err := pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error { return o.Enqueue(ctx, sp, msg("c4", "c")) }); err != nil {
			return err
		}
		_ = pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
			if err := o.Enqueue(ctx, sp, msg("c-gone", "c")); err != nil {
				return err
			}
			return boom
		})
		return o.Enqueue(ctx, tx, msg("c5", "c"))
	}))
	got := keySeqs(t, pool)
	for i, id := range []string{"c1", "c2", "c3", "c4", "c5"} {
		require.EqualValues(t, i+1, got[id], id)
	}

	// Deleting them (the counter was written with c1 only) and truncating
	// keep the numbering.
	_, err = pool.Exec(ctx, `DELETE FROM pgrelay.outbox WHERE key = 'c'`)
	require.NoError(t, err)
	require.NoError(t, enqueue(t, pool, o, msg("c6", "c")))
	require.EqualValues(t, 6, keySeqs(t, pool)["c6"])
	require.NoError(t, pgx.BeginTxFunc(ctx, pool, opts, func(tx pgx.Tx) error {
		return o.Enqueue(ctx, tx, msg("c7", "c"), msg("c8", "c"))
	}))
	_, err = pool.Exec(ctx, `TRUNCATE pgrelay.outbox`)
	require.NoError(t, err)
	require.NoError(t, enqueue(t, pool, o, msg("a5", "a"), msg("c9", "c")))
	require.Equal(t, map[string]int64{"a5": 5, "c9": 9}, keySeqs(t, pool))
}

// TestKeySeqConcurrentProducers: producers of one key racing, some rolling
// back: the committed events carry 1..n exactly once, in id (commit) order.
func TestKeySeqConcurrentProducers(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	o, err := pgrelay.NewOutbox(pgrelay.OutboxConfig{})
	require.NoError(t, err)
	ctx := context.Background()
	const producers, each = 6, 20
	errs := make(chan error, producers)
	for p := range producers {
		go func() {
			for i := range each {
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					m := pgrelay.Message{EventID: fmt.Sprintf("x-%d-%d", p, i), Topic: "orders", Key: "x", EventType: "T"}
					if err := o.Enqueue(ctx, tx, m); err != nil {
						return err
					}
					if i%5 == 4 {
						return errRolledBack
					}
					return nil
				})
				if err != nil && !errors.Is(err, errRolledBack) {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range producers {
		require.NoError(t, <-errs)
	}
	rows, err := pool.Query(ctx, `SELECT key_seq FROM pgrelay.outbox WHERE key = 'x' ORDER BY id`)
	require.NoError(t, err)
	seqs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.Len(t, seqs, producers*each*4/5)
	for i, s := range seqs {
		require.EqualValues(t, i+1, s, "sequence %d in id order", i)
	}
}

var errRolledBack = errors.New("rolled back")

// TestKeySeqLookupsStayOnIndexes: the insert trigger's per-row lookups (the
// event id, the key's highest number) use their indexes whatever the
// statistics say. Just after an ANALYZE of an empty outbox, a cached generic
// plan scanned the whole table for each inserted row: one statement of 50,000
// keyed events took minutes. Counted with the transaction's own scan
// statistics, so the test does not time anything.
func TestKeySeqLookupsStayOnIndexes(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `ANALYZE pgrelay.outbox`)
	require.NoError(t, err)
	const rows = 300
	_, err = tx.Exec(ctx, `INSERT INTO pgrelay.outbox (event_id, topic, key)
		SELECT 'ix-' || g, 'orders', 'key-' || (g % 10) FROM generate_series(1, $1::int) AS g`, rows)
	require.NoError(t, err)
	var seqScans int64
	require.NoError(t, tx.QueryRow(ctx, `SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relid = 'pgrelay.outbox'::regclass`).Scan(&seqScans))
	require.Less(t, seqScans, int64(10), "the trigger scanned the outbox %d times for %d rows", seqScans, rows)
	var maxSeq int64
	require.NoError(t, tx.QueryRow(ctx, `SELECT max(key_seq) FROM pgrelay.outbox WHERE key = 'key-1'`).Scan(&maxSeq))
	require.Equal(t, int64(rows/10), maxSeq)
}

// TestKeySeqStaleSnapshotProducerNeverReusesANumber: a REPEATABLE READ or
// SERIALIZABLE producer whose snapshot predates another producer's commit of
// the same key cannot see that event's number. Whatever the other producer's
// isolation level (a READ COMMITTED one writes no counter row), it fails with
// ErrKeySeqRace or a serialization failure, never stores the number twice, and
// its retry gets the next one.
func TestKeySeqStaleSnapshotProducerNeverReusesANumber(t *testing.T) {
	t.Parallel()
	levels := []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable}
	for _, late := range levels[1:] {
		for _, early := range levels {
			t.Run(string(late)+" after "+string(early), func(t *testing.T) {
				t.Parallel()
				pool := testdb.New(t)
				o, err := pgrelay.NewOutbox(pgrelay.OutboxConfig{})
				require.NoError(t, err)
				ctx := context.Background()
				msg := func(id string) pgrelay.Message {
					return pgrelay.Message{EventID: id, Topic: "orders", Key: "k", EventType: "T"}
				}
				tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: late})
				require.NoError(t, err)
				defer func() { _ = tx.Rollback(ctx) }()
				_, err = tx.Exec(ctx, `SELECT 1`) // the snapshot
				require.NoError(t, err)
				require.NoError(t, pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: early}, func(tx pgx.Tx) error {
					return o.Enqueue(ctx, tx, msg("early"))
				}))
				err = o.Enqueue(ctx, tx, msg("late"))
				if err == nil {
					err = tx.Commit(ctx)
				}
				var pgErr *pgconn.PgError
				if !errors.Is(err, pgrelay.ErrKeySeqRace) {
					require.ErrorAs(t, err, &pgErr, "the stale producer must fail, got %v", err)
					require.Equal(t, "40001", pgErr.Code, "%v", err)
				}
				require.NoError(t, pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: late}, func(tx pgx.Tx) error {
					return o.Enqueue(ctx, tx, msg("late"))
				}))
				require.Equal(t, map[string]int64{"early": 1, "late": 2}, keySeqs(t, pool))
			})
		}
	}
}
