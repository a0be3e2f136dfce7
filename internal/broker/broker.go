// Package broker is the seam between the relay and a message broker: the
// Publisher interface, the classification of publish failures, and the NATS
// JetStream implementation (with an embeddable server for a first run that
// needs only PostgreSQL).
package broker

import (
	"context"
	"errors"
	"fmt"
)

// Publisher publishes batches of events to a broker.
type Publisher interface {
	// Publish sends every message and waits until each one is acknowledged
	// (persisted by the broker) or has failed, or ctx is done. It returns one
	// Result per message, in order. Messages of one key are sent in slice
	// order, and none of a key's later messages is stored once an earlier one
	// failed transiently.
	Publish(ctx context.Context, msgs []Message) []Result
	// Close releases the publisher's connections.
	Close() error
}

// Result is the outcome of publishing one message.
type Result struct {
	// Err is nil once the broker acknowledged the message. Otherwise it is
	// the failure; IsPermanent tells whether retrying can help.
	Err error
	// Duplicate is set when the broker acknowledged the message as a
	// duplicate of one it already holds (same event id).
	Duplicate bool
}

// PermanentError marks a failure that no retry can fix (the message is too
// large, no stream accepts its subject): the relay dead-letters the event.
type PermanentError struct {
	Err error
}

// Error returns the reason.
func (e *PermanentError) Error() string { return "permanent: " + e.Err.Error() }

// Unwrap returns the underlying error.
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent wraps err as a PermanentError.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// Permanentf formats a PermanentError.
func Permanentf(format string, args ...any) error {
	return &PermanentError{Err: fmt.Errorf(format, args...)}
}

// IsPermanent reports whether err is a PermanentError.
func IsPermanent(err error) bool {
	var p *PermanentError
	return errors.As(err, &p)
}
