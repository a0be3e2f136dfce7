package pgrelay_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// TestEmitValidatesAndTouchesNoTable: Emit refuses what Enqueue refuses,
// before writing anything, and writes no outbox row; pgrelay.emit refuses an
// invalid topic. (Decoding the messages is the WAL relay's tests' part, on a
// cluster with wal_level = logical.)
func TestEmitValidatesAndTouchesNoTable(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return pgrelay.Emit(ctx, tx, pgrelay.Message{Topic: "orders", Payload: []byte("1")}, pgrelay.Message{Payload: []byte("2")})
	})
	require.ErrorIs(t, err, pgrelay.ErrMissingTopic)
	require.ErrorContains(t, err, "message 1")

	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return pgrelay.Emit(ctx, tx, pgrelay.Message{Topic: "orders", Key: "k", Payload: []byte("1")})
	}))
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pgrelay.outbox`).Scan(&n))
	require.Zero(t, n)

	var id string
	require.NoError(t, pool.QueryRow(ctx, `SELECT pgrelay.emit('orders', '\x01'::bytea)`).Scan(&id))
	require.Len(t, id, 36, "a random UUID")
	_, err = pool.Exec(ctx, `SELECT pgrelay.emit('orders.*', '\x01'::bytea)`)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "22023", pgErr.Code)
}
