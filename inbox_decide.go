package pgrelay

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/pgrelay/pgrelay/internal/wait"
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
// attempt that just failed; random returns a number in [0, 1). The reason is
// always storable as PostgreSQL text, whatever the handler's error says.
func decide(p policy, err error, attempts, deferrals int, random func() float64) decision {
	d := decideRaw(p, err, attempts, deferrals, random)
	d.reason = storable(d.reason)
	return d
}

func decideRaw(p policy, err error, attempts, deferrals int, random func() float64) decision {
	var d *DeferError
	var exp *expiredErr
	switch {
	case errors.As(err, &exp):
		return decision{outcome: outcomeDead, reason: exp.Error()}
	case isPermanent(err):
		return decision{outcome: outcomeDead, reason: err.Error()}
	case errors.As(err, &d):
		if d.WaitingFor == "" {
			return decision{outcome: outcomeDead, reason: "permanent: Defer called with an empty dependency name"}
		}
		if storable(d.WaitingFor) != d.WaitingFor || len(d.WaitingFor) > maxDependencyLen {
			return decision{outcome: outcomeDead, reason: fmt.Sprintf(
				"permanent: Defer called with a dependency name that is not valid UTF-8 text of at most %d bytes without NUL", maxDependencyLen)}
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
		return decision{outcome: outcomeRetry, delay: retryDelay(attempts, p.backoffMin, p.backoffMax, random),
			reason: err.Error()}
	}
}

// retryDelay returns the wait before the attempt after attempt number attempt
// (1-based): the backoff's ceiling (min, 2·min, 4·min, ... capped at max,
// wait.Policy) with full jitter above the floor: uniform in [min, ceiling].
func retryDelay(attempt int, minD, maxD time.Duration, random func() float64) time.Duration {
	ceiling := wait.Policy{Min: minD, Max: maxD}.Ceiling(attempt)
	if ceiling <= minD {
		return minD
	}
	return minD + time.Duration(random()*float64(ceiling-minD))
}

// maxReasonLen bounds a recorded failure reason, in bytes.
const maxReasonLen = 4096

// maxDependencyLen bounds a Defer dependency name, in bytes.
const maxDependencyLen = 1024

// storable returns reason as PostgreSQL can store it in a text column: valid
// UTF-8, NUL bytes spelled out, at most maxReasonLen bytes. Without it an error
// that quotes hostile input would make recording the failure itself fail.
func storable(reason string) string {
	reason = strings.ReplaceAll(strings.ToValidUTF8(reason, "\uFFFD"), "\x00", `\0`)
	if len(reason) > maxReasonLen {
		reason = strings.ToValidUTF8(reason[:maxReasonLen], "") + "…"
	}
	return reason
}
