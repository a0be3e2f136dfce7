package inbox

import (
	"errors"
	"fmt"
	"time"
)

// outcome is what happens to an event after its handler failed.
type outcome int

const (
	outcomeRetry outcome = iota + 1
	outcomeDefer
	outcomeDead
)

// decision is the pure core of the failure path: given the handler's error and
// the event's counters, where the event goes next.
type decision struct {
	outcome    outcome
	delay      time.Duration // retry: wait before the next attempt; defer: fallback
	reason     string        // recorded as last_error
	waitingFor string        // defer only
}

// policy holds the settings decide needs.
type policy struct {
	maxAttempts   int
	maxDeferrals  int
	backoffMin    time.Duration
	backoffMax    time.Duration
	deferFallback time.Duration
}

// decide maps a handler error to the event's next state. attempts counts the
// attempt that just failed; random returns a number in [0, 1).
func decide(p policy, err error, attempts, deferrals int, random func() float64) decision {
	var d *DeferError
	switch {
	case IsPermanent(err):
		return decision{outcome: outcomeDead, reason: err.Error()}
	case errors.As(err, &d):
		if d.WaitingFor == "" {
			return decision{outcome: outcomeDead, reason: "permanent: Defer called with an empty dependency name"}
		}
		if deferrals >= p.maxDeferrals {
			return decision{outcome: outcomeDead, reason: fmt.Sprintf(
				"deferrals exhausted: still waiting for %s after %d deferrals", d.WaitingFor, deferrals)}
		}
		return decision{outcome: outcomeDefer, delay: p.deferFallback, waitingFor: d.WaitingFor,
			reason: d.Error()}
	case attempts >= p.maxAttempts:
		return decision{outcome: outcomeDead, reason: fmt.Sprintf(
			"attempts exhausted: %d of %d: %v", attempts, p.maxAttempts, err)}
	default:
		return decision{outcome: outcomeRetry, delay: backoff(attempts, p.backoffMin, p.backoffMax, random),
			reason: err.Error()}
	}
}

// backoff returns the wait before the attempt after attempt number attempt
// (1-based): exponential (min, 2·min, 4·min, ...) capped at max, with full
// jitter above the floor: uniform in [min, ceiling].
func backoff(attempt int, minD, maxD time.Duration, random func() float64) time.Duration {
	ceiling := minD
	for i := 1; i < attempt && ceiling < maxD; i++ {
		ceiling *= 2
	}
	ceiling = min(ceiling, maxD)
	if ceiling <= minD {
		return minD
	}
	return minD + time.Duration(random()*float64(ceiling-minD))
}
