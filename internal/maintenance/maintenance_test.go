package maintenance

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestDeleteRunsBatchesUntilShort: batches run until one deletes fewer rows
// than the size; the total is returned; each batch gets its own deadline.
func TestDeleteRunsBatchesUntilShort(t *testing.T) {
	t.Parallel()
	left := int64(25)
	calls := 0
	total, err := Batches{Size: 10, Timeout: time.Second}.Delete(context.Background(), func(ctx context.Context, size int32) (int64, error) {
		calls++
		_, ok := ctx.Deadline()
		require.True(t, ok, "a batch without a deadline")
		n := min(left, int64(size))
		left -= n
		return n, nil
	})
	require.NoError(t, err)
	require.Equal(t, int64(25), total)
	require.Equal(t, 3, calls)
}

// TestDeleteStopsOnErrorAndCancel: a failing batch ends the run with the
// rows deleted so far; a cancelled context ends it after the batch in hand.
func TestDeleteStopsOnErrorAndCancel(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	calls := 0
	total, err := Batches{Size: 1, Timeout: time.Second}.Delete(context.Background(), func(context.Context, int32) (int64, error) {
		calls++
		if calls == 3 {
			return 0, boom
		}
		return 1, nil
	})
	require.ErrorIs(t, err, boom)
	require.Equal(t, int64(2), total)

	ctx, cancel := context.WithCancel(context.Background())
	calls = 0
	total, err = Batches{Size: 1, Pause: time.Hour, Timeout: time.Second}.Delete(ctx, func(context.Context, int32) (int64, error) {
		calls++
		cancel()
		return 1, nil
	})
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, int64(1), total)
	require.Equal(t, 1, calls)
}
