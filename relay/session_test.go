package relay

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestLockSessionAwaitsConfirmation: a batch that finds the lock session
// unconfirmed (its check slower than lockValidFor) waits for the next
// confirmation instead of failing; it gives up when the session ends, at
// its deadline, or with its context.
func TestLockSessionAwaitsConfirmation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	s := newLockSession(1)
	s.confirm(time.Now().Add(-2 * lockValidFor)) // lapsed
	require.False(t, s.valid())
	go func() {
		time.Sleep(50 * time.Millisecond)
		s.confirm(time.Now())
	}()
	began := time.Now()
	require.True(t, s.await(ctx, 10*time.Second), "confirmed again while waiting")
	require.Less(t, time.Since(began), 5*time.Second, "woken by the confirmation, not the deadline")

	// A confirmation of a check sent too long ago does not make it valid.
	s = newLockSession(2)
	go func() {
		time.Sleep(20 * time.Millisecond)
		s.confirm(time.Now().Add(-2 * lockValidFor))
		time.Sleep(20 * time.Millisecond)
		s.end()
	}()
	require.False(t, s.await(ctx, 10*time.Second), "ended while waiting")
	require.False(t, s.await(ctx, 10*time.Second), "ended")

	s = newLockSession(3)
	require.False(t, s.await(ctx, 30*time.Millisecond), "never confirmed: the deadline")
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	require.False(t, s.await(cctx, 10*time.Second), "cancelled")
}
