package pgrelay_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

func TestEnqueue(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return pgrelay.Enqueue(ctx, tx,
			pgrelay.Message{Topic: "orders", Key: "order-1", EventType: "OrderCreated", Payload: []byte(`{}`)},
			pgrelay.Message{Topic: "orders", Key: "order-1", EventType: "OrderPaid", Payload: []byte(`{}`)},
		)
	})
	require.NoError(t, err)
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pgrelay.outbox WHERE status = 'pending'`).Scan(&n))
	require.Equal(t, 2, n)

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return pgrelay.Enqueue(ctx, tx, pgrelay.Message{Key: "order-1"})
	})
	require.True(t, errors.Is(err, pgrelay.ErrMissingTopic), "%v", err)

	small, err := pgrelay.NewOutbox(pgrelay.OutboxConfig{MaxPayloadBytes: 4})
	require.NoError(t, err)
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return small.Enqueue(ctx, tx, pgrelay.Message{Topic: "orders", Payload: []byte("12345")})
	})
	require.ErrorIs(t, err, pgrelay.ErrPayloadTooLarge)
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pgrelay.outbox`).Scan(&n))
	require.Equal(t, 2, n, "rejected messages write nothing")
}
