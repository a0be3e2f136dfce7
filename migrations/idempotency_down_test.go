package migrations_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/testdb"
)

// TestIdempotencyDownRefusesLiveKeys: rolling back 00050 refuses while an
// unexpired idempotency key exists (its retries would run again), goes ahead
// once only expired keys are left.
func TestIdempotencyDownRefusesLiveKeys(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pool, version, ops := provider(t, url, false)
	before, err := version(ctx)
	require.NoError(t, err)
	require.GreaterOrEqual(t, before, int64(50))
	// Roll back whatever comes after 00050 first.
	for before > 50 {
		_, err := ops.down(ctx)
		require.NoError(t, err)
		before, err = version(ctx)
		require.NoError(t, err)
	}
	_, err = pool.Exec(ctx, `INSERT INTO pgrelay.guard_keys (key, token, state, expires_at) VALUES ('webhook:1', 't', 'confirmed', now() + interval '1 hour')`)
	require.NoError(t, err)
	_, err = ops.down(ctx)
	require.ErrorContains(t, err, "migrate down: 00050_idempotency would drop data")
	after, err := version(ctx)
	require.NoError(t, err)
	require.Equal(t, before, after, "a refused rollback changes nothing")

	_, err = pool.Exec(ctx, `UPDATE pgrelay.guard_keys SET expires_at = now() - interval '1 second'`)
	require.NoError(t, err)
	_, err = ops.down(ctx)
	require.NoError(t, err, "only expired keys: nothing is lost")
}
