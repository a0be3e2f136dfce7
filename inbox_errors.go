package pgrelay

import (
	"errors"
	"time"

	"github.com/pgrelay/pgrelay/internal/event"
)

// permanentError marks a handler error as not worth retrying.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return "permanent: " + e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks a handler error as permanent: the event goes dead with the
// error as its reason instead of being retried.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// isPermanent reports whether err, or an error it wraps, was made by Permanent.
func isPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// DeferError is returned by a handler (see Defer) to put its event back until
// the dependency named WaitingFor is released.
type DeferError struct {
	// WaitingFor names the dependency, for example "order:42".
	WaitingFor string
}

func (e *DeferError) Error() string { return "deferred: waiting for " + e.WaitingFor }

// Defer is returned by a handler whose event must wait for a dependency (for
// example "order:42"); the event runs again once Release is called with the
// same key (or after InboxConfig.DeferFallback), without using up an attempt.
// An event deferred more than InboxConfig.MaxDeferrals times goes dead.
func Defer(waitingFor string) error {
	return &DeferError{WaitingFor: waitingFor}
}

// expiredErr is the failure of an event whose ExpiresAt passed before a
// handler ran it: the worker never calls the handler for it and stores it
// dead, with a reason starting with "expired".
type expiredErr struct {
	// ExpiresAt is the event's expiry.
	ExpiresAt time.Time
}

func (e *expiredErr) Error() string {
	return event.ReasonExpired + ": not applied after its expiry " + e.ExpiresAt.UTC().Format(time.RFC3339Nano)
}

// expiredError returns an *expiredErr when ev has expired at now, else nil.
func expiredError(ev *InboxEvent, now time.Time) error {
	if !ev.expired(now) {
		return nil
	}
	return &expiredErr{ExpiresAt: ev.ExpiresAt}
}

// expiredEvents returns the failures of the events of evs expired at now, or
// nil when none is.
func expiredEvents(evs []*InboxEvent, now time.Time) map[*InboxEvent]error {
	var out map[*InboxEvent]error
	for _, ev := range evs {
		if err := expiredError(ev, now); err != nil {
			if out == nil {
				out = make(map[*InboxEvent]error)
			}
			out[ev] = err
		}
	}
	return out
}
