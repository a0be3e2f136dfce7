package wait

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestJitterStaysWithinSpread: every jittered wait lies within the spread,
// and the draws cover both sides of it.
func TestJitterStaysWithinSpread(t *testing.T) {
	t.Parallel()
	for _, spread := range []float64{0.1, 0.2, 0.5} {
		d := time.Second
		lo, hi := time.Duration(float64(d)*(1-spread)), time.Duration(float64(d)*(1+spread))
		var below, above bool
		for range 2000 {
			j := Jitter(d, spread)
			require.True(t, j >= lo && j <= hi, "spread %g: %s outside [%s, %s]", spread, j, lo, hi)
			below = below || j < d-time.Duration(float64(d)*spread/2)
			above = above || j > d+time.Duration(float64(d)*spread/2)
		}
		require.True(t, below && above, "spread %g: the draws do not cover the range", spread)
	}
}

// TestJitterEdgeCases: no spread, a non-positive duration or a NaN spread
// leave the duration as it is; a spread over 1 never gives a negative wait.
func TestJitterEdgeCases(t *testing.T) {
	t.Parallel()
	require.Equal(t, time.Second, Jitter(time.Second, 0))
	require.Equal(t, time.Duration(0), Jitter(0, 0.5))
	require.Equal(t, -time.Second, Jitter(-time.Second, 0.5))
	nan := 0.0
	nan /= nan
	require.Equal(t, time.Second, Jitter(time.Second, nan))
	for range 1000 {
		require.GreaterOrEqual(t, Jitter(time.Second, 3), time.Duration(0))
	}
}

// TestPolicyDoublesUpToMax: the un-jittered waits double from Min and stop at
// Max; a Max below Min is Min.
func TestPolicyDoublesUpToMax(t *testing.T) {
	t.Parallel()
	p := Policy{Min: 100 * time.Millisecond, Max: time.Second}
	for n, want := range map[int]time.Duration{-1: 100 * time.Millisecond, 0: 100 * time.Millisecond,
		1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 4: 800 * time.Millisecond, 5: time.Second, 1000: time.Second} {
		require.Equal(t, want, p.Ceiling(n), "failure %d", n)
		require.Equal(t, want, p.Delay(n), "failure %d: no spread, no jitter", n)
	}
	require.Equal(t, time.Second, Policy{Min: time.Second, Max: time.Millisecond}.Ceiling(7))
}

// TestBackoffCountsAndResets: Next climbs the policy's steps, Last repeats
// the last wait, Reset starts again from Min.
func TestBackoffCountsAndResets(t *testing.T) {
	t.Parallel()
	b := New(Policy{Min: time.Millisecond, Max: 4 * time.Millisecond})
	require.Zero(t, b.Last())
	for _, want := range []time.Duration{1, 2, 4, 4} {
		require.Equal(t, want*time.Millisecond, b.Next())
		require.Equal(t, want*time.Millisecond, b.Last())
	}
	require.Equal(t, 4, b.Failures())
	b.Reset()
	require.Zero(t, b.Failures())
	require.Zero(t, b.Last())
	require.Equal(t, time.Millisecond, b.Next())

	j := New(Policy{Min: time.Second, Max: time.Minute, Spread: 0.1})
	d := j.Next()
	require.True(t, d >= 900*time.Millisecond && d <= 1100*time.Millisecond, "%s", d)
}

// TestSleepEndsWithContext: Sleep returns false at once when ctx ends, true
// after the wait otherwise.
func TestSleepEndsWithContext(t *testing.T) {
	t.Parallel()
	require.True(t, Sleep(context.Background(), time.Millisecond))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	require.False(t, Sleep(ctx, time.Hour))
	require.Less(t, time.Since(start), time.Second)
}

// TestEveryRunsAtOnceThenOnInterval: the first run is immediate, later ones
// follow the interval, and cancelling ends the loop.
func TestEveryRunsAtOnceThenOnInterval(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	runs := make(chan time.Time, 10)
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		Every(ctx, 20*time.Millisecond, 0.2, func(context.Context) { runs <- time.Now() })
	}()
	first := <-runs
	require.Less(t, first.Sub(start), 15*time.Millisecond, "the first run waited for the interval")
	second := <-runs
	require.GreaterOrEqual(t, second.Sub(first), 15*time.Millisecond)
	cancel()
	<-done
}

// TestTickStopsOnErrorOrCancel: Tick calls fn on each tick (not at once),
// returns fn's first error, and returns nil once ctx ends.
func TestTickStopsOnErrorOrCancel(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	calls := 0
	start := time.Now()
	err := Tick(context.Background(), 5*time.Millisecond, func() error {
		if calls == 0 {
			require.GreaterOrEqual(t, time.Since(start), 4*time.Millisecond, "called before the first tick")
		}
		calls++
		if calls == 3 {
			return boom
		}
		return nil
	})
	require.ErrorIs(t, err, boom)
	require.Equal(t, 3, calls)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.NoError(t, Tick(ctx, time.Hour, func() error { return boom }))
}
