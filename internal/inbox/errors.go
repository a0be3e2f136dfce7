package inbox

import (
	"errors"
	"fmt"
	"time"

	"github.com/pgrelay/pgrelay/internal/event"
)

// permanentError marks a handler error as not worth retrying.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return "permanent: " + e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent wraps err so that the worker moves the event straight to the dead
// letter state, with err as the recorded reason, instead of retrying it. Use it
// for input that can never succeed: malformed payloads, unknown event types.
// Permanent(nil) returns nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err, or an error it wraps, was made by Permanent.
func IsPermanent(err error) bool {
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

// Defer returns the error a handler returns when its event cannot be handled
// yet because something it depends on has not arrived (an OrderPaid before its
// OrderCreated). The event goes back to pending with its attempt refunded and
// runs again as soon as a handler calls Release(ctx, tx, waitingFor), or after
// Config.DeferFallback at the latest. An event deferred more than
// Config.MaxDeferrals times goes dead, so nothing waits forever.
func Defer(waitingFor string) error {
	return &DeferError{WaitingFor: waitingFor}
}

// InvalidMessageError reports a message Receive refused; nothing of its batch
// was stored. The caller can store it as dead instead (Incoming.DeadReason).
type InvalidMessageError struct {
	// Index is the message's position in the batch.
	Index int
	// EventID is the message's event id as received (possibly empty).
	EventID string
	// Err says what is wrong.
	Err error
}

func (e *InvalidMessageError) Error() string {
	return fmt.Sprintf("inbox: message %d (event_id %q): %v", e.Index, e.EventID, e.Err)
}

func (e *InvalidMessageError) Unwrap() error { return e.Err }

// ExpiredError is the failure of an event whose ExpiresAt passed before a
// handler ran it: the worker never calls the handler for it and stores it
// dead, with a reason starting with "expired".
type ExpiredError struct {
	// ExpiresAt is the event's expiry.
	ExpiresAt time.Time
}

func (e *ExpiredError) Error() string {
	return event.ReasonExpired + ": not applied after its expiry " + e.ExpiresAt.UTC().Format(time.RFC3339Nano)
}

// expiredError returns an *ExpiredError when ev has expired at now, else nil.
func expiredError(ev *Event, now time.Time) error {
	if !ev.Expired(now) {
		return nil
	}
	return &ExpiredError{ExpiresAt: ev.ExpiresAt}
}

// expiredEvents returns the failures of the events of evs expired at now, or
// nil when none is.
func expiredEvents(evs []*Event, now time.Time) map[*Event]error {
	var out map[*Event]error
	for _, ev := range evs {
		if err := expiredError(ev, now); err != nil {
			if out == nil {
				out = make(map[*Event]error)
			}
			out[ev] = err
		}
	}
	return out
}
