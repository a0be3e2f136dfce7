package pgrelay_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// TestEnqueueStoresSchedule: NotBefore and ExpiresAt are stored as given
// (to the microsecond), Delay is resolved by the insert on the database's
// clock (not the producer's), the later of NotBefore and Delay counts, and a
// message with none stores NULLs. Out-of-range times and a negative Delay are
// refused, naming the field.
func TestEnqueueStoresSchedule(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	o, err := pgrelay.NewOutbox(pgrelay.OutboxConfig{})
	require.NoError(t, err)
	nb := time.Date(2031, 5, 6, 7, 8, 9, 123456789, time.UTC)
	exp := time.Date(2032, 1, 1, 0, 0, 0, 0, time.UTC)
	var before, after time.Time
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&before); err != nil {
			return err
		}
		err := o.Enqueue(ctx, tx,
			pgrelay.Message{EventID: "plain", Topic: "orders"},
			pgrelay.Message{EventID: "at", Topic: "orders", NotBefore: nb, ExpiresAt: exp},
			pgrelay.Message{EventID: "delay", Topic: "orders", Delay: time.Hour},
			pgrelay.Message{EventID: "both", Topic: "orders", NotBefore: before.Add(-time.Minute), Delay: time.Minute})
		if err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&after)
	}))
	read := func(id string) (notBefore, expiresAt *time.Time) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT not_before, expires_at FROM pgrelay.outbox WHERE event_id = $1`, id).Scan(&notBefore, &expiresAt))
		return notBefore, expiresAt
	}
	n, e := read("plain")
	require.Nil(t, n)
	require.Nil(t, e)
	n, e = read("at")
	require.True(t, n.Equal(nb.Round(time.Microsecond)), "not_before %s", n)
	require.True(t, e.Equal(exp), "expires_at %s", e)
	n, e = read("delay")
	require.Nil(t, e)
	require.False(t, n.Before(before.Add(time.Hour)), "not_before %s before the insert + 1h", n)
	require.False(t, n.After(after.Add(time.Hour)), "not_before %s after the insert + 1h", n)
	n, _ = read("both")
	require.False(t, n.Before(before.Add(time.Minute)), "the later of NotBefore and Delay counts: %s", n)

	for name, m := range map[string]pgrelay.Message{
		"Delay":     {Topic: "orders", Delay: -time.Second},
		"NotBefore": {Topic: "orders", NotBefore: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)},
		"ExpiresAt": {Topic: "orders", ExpiresAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)},
	} {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return o.Enqueue(ctx, tx, m) })
		require.ErrorIs(t, err, pgrelay.ErrInvalidSchedule, name)
		require.ErrorContains(t, err, name)
	}
}

// TestEmitRefusesDelay: WAL capture publishes in WAL order and cannot hold
// an event back, so Emit refuses NotBefore and Delay, naming them, and
// writes nothing.
func TestEmitRefusesDelay(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	o, err := pgrelay.NewOutbox(pgrelay.OutboxConfig{})
	require.NoError(t, err)
	for _, m := range []pgrelay.Message{
		{Topic: "orders", NotBefore: time.Now().Add(time.Hour)},
		{Topic: "orders", Delay: time.Minute},
	} {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return o.Emit(ctx, tx, m) })
		require.ErrorIs(t, err, pgrelay.ErrInvalidSchedule)
		require.ErrorContains(t, err, "WAL capture cannot delay")
	}
}
