// Package wait is how pgrelay's loops wait: one jitter, one exponential
// backoff, a cancellable sleep and the periodic loops. The relay's and the
// inbox's polls and retries, the consumer's fetch and store retries, the
// LISTEN reconnects (internal/notifier), the table upkeep's intervals
// (internal/maintenance), the broker adapters' reconnects and the periodic
// reports all use it.
package wait

import (
	"context"
	"math/rand/v2"
	"time"
)

// Jitter returns d scaled by a random factor drawn uniformly from
// [1-spread, 1+spread]: spread 0.1 is ±10%, 0.5 is ×0.5–1.5. Waits that many
// goroutines or processes start together are jittered so that they do not
// stay in step. A non-positive d or spread returns d unchanged; spread is
// capped at 1.
func Jitter(d time.Duration, spread float64) time.Duration {
	if d <= 0 || !(spread > 0) {
		return d
	}
	spread = min(spread, 1)
	return time.Duration(float64(d) * (1 - spread + 2*spread*rand.Float64()))
}

// Policy is an exponential backoff: the wait after the n-th failure in a row
// (n from 1) is Min·2^(n-1), capped at Max, jittered by Spread (see Jitter).
type Policy struct {
	// Min is the first wait. Required (positive).
	Min time.Duration
	// Max caps the un-jittered wait. A value below Min is taken as Min.
	Max time.Duration
	// Spread is the jitter around each wait; 0 waits exactly.
	Spread float64
}

// Ceiling returns the un-jittered wait after failure number n (from 1; a
// smaller n counts as 1): Min·2^(n-1), capped at Max.
func (p Policy) Ceiling(n int) time.Duration {
	d, ceiling := p.Min, max(p.Max, p.Min)
	for i := 1; i < n && d < ceiling; i++ {
		d *= 2
	}
	return min(d, ceiling)
}

// Delay returns the jittered wait after failure number n.
func (p Policy) Delay(n int) time.Duration { return Jitter(p.Ceiling(n), p.Spread) }

// Backoff counts the failures in a row of one loop over a Policy. It is not
// safe for concurrent use.
type Backoff struct {
	policy   Policy
	failures int
	last     time.Duration
}

// New returns a Backoff over p with no failure counted.
func New(p Policy) *Backoff { return &Backoff{policy: p} }

// Next counts one more failure and returns the wait before the next try.
func (b *Backoff) Next() time.Duration {
	b.failures++
	b.last = b.policy.Delay(b.failures)
	return b.last
}

// Last returns the wait Next returned last, 0 after Reset.
func (b *Backoff) Last() time.Duration { return b.last }

// Failures returns the failures counted since the last Reset.
func (b *Backoff) Failures() int { return b.failures }

// Reset forgets the failures: the next wait is Min again.
func (b *Backoff) Reset() { b.failures, b.last = 0, 0 }

// Sleep waits for d or until ctx ends, and reports whether ctx is still live.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Every calls run at once, then again every interval (jittered ±spread)
// after the previous call returned, until ctx ends.
func Every(ctx context.Context, interval time.Duration, spread float64, run func(context.Context)) {
	for ctx.Err() == nil {
		run(ctx)
		if !Sleep(ctx, Jitter(interval, spread)) {
			return
		}
	}
}

// Tick calls fn every interval, on a ticker (the first call one interval
// from now), until ctx ends or fn fails, and returns fn's error (nil when ctx
// ended).
func Tick(ctx context.Context, interval time.Duration, fn func() error) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if err := fn(); err != nil {
				return err
			}
		}
	}
}
