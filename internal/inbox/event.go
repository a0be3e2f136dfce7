package inbox

import (
	"context"
	"encoding/json"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgrelay/pgrelay/internal/db"
	"github.com/pgrelay/pgrelay/internal/event"
)

// Event is a claimed inbox event, as a handler sees it.
type Event struct {
	event.Message
	// Handler is the name of the handler the event's inbox row belongs to.
	Handler string
	// DedupKey is the row's dedup key under the handler's key strategy (the
	// event id for the message-id strategy).
	DedupKey string
	// ReceivedAt is when the inbox stored the event.
	ReceivedAt time.Time
	// Attempts counts the attempts so far, this one included (1 on the first).
	Attempts int
	// Deferrals counts how often the event was deferred (see Defer).
	Deferrals int
	// LockVersion is the fencing version of this claim.
	LockVersion int64
	// LastError is the error recorded by the previous attempt, if any.
	LastError string

	heldBack bool // ordered mode: handed back out of order by this claim
}

// Handler runs an event's side effect. It must do all its database work in tx:
// that transaction also records the event as processed, so the effect and the
// mark commit together or not at all. A nil error means success; any other
// error is retried with backoff, except Permanent errors (dead at once) and
// Defer (wait for a dependency). A panic is recovered and treated like a
// transient error. ctx expires after Config.HandlerTimeout. Events the handler
// enqueues in tx with ctx (outbox Enqueue) record ev as their cause: headers
// Pgrelay-Causation-Id (ev's event id) and Pgrelay-Correlation-Id (ev's
// correlation id, or its event id); they are published if and only if tx
// commits.
type Handler interface {
	Handle(ctx context.Context, tx pgx.Tx, ev *Event) error
}

// BatchHandler is a Handler that can also apply a whole claimed batch at once,
// typically with one set-based statement per kind of effect. The worker calls
// HandleBatch first, in the transaction that then marks every event of the
// batch processed with one statement. When HandleBatch returns any error (or
// panics, or an event was taken over by another worker meanwhile) that
// transaction is rolled back and the batch runs again event by event through
// Handle, each event isolated in a savepoint, so the error of one event never
// fails the others. HandleBatch may therefore return an error for anything it
// does not handle in bulk (an event to defer, a malformed payload): Handle
// decides per event. ctx expires after Config.HandlerTimeout for the whole
// batch. evs is in arrival order and must not be modified. ctx names no cause:
// to link events enqueued here to their input, use event.CausedBy per input.
type BatchHandler interface {
	Handler
	HandleBatch(ctx context.Context, tx pgx.Tx, evs []*Event) error
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, tx pgx.Tx, ev *Event) error

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, tx pgx.Tx, ev *Event) error { return f(ctx, tx, ev) }

// claimed is the part of a claim row the worker needs, whichever claim query
// produced it.
type claimed struct {
	ev     Event
	status string
}

func fromClaimRow(r db.ClaimInboxRow) claimed {
	c := claimed{status: r.Status, ev: newEvent(r.EventID, r.Topic, r.Key, r.EventType, r.Payload,
		r.Headers, r.OccurredAt, r.ReceivedAt, r.Attempts, r.Deferrals, r.LockVersion, r.LastError)}
	c.ev.Handler, c.ev.DedupKey = r.Handler, r.DedupKey
	c.ev.KeySeq = seqOf(r.KeySeq)
	return c
}

func fromOrderedRow(r db.ClaimInboxOrderedRow) claimed {
	c := claimed{status: r.Status, ev: newEvent(r.EventID, r.Topic, r.Key, r.EventType, r.Payload,
		r.Headers, r.OccurredAt, r.ReceivedAt, r.Attempts, r.Deferrals, r.LockVersion, r.LastError)}
	c.ev.Handler, c.ev.DedupKey = r.Handler, r.DedupKey
	c.ev.KeySeq = seqOf(r.KeySeq)
	return c
}

func seqOf(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

func fromLostRow(r db.ClaimInboxLostRow) claimed {
	c := claimed{status: r.Status, ev: newEvent(r.EventID, r.Topic, r.Key, r.EventType, r.Payload,
		r.Headers, r.OccurredAt, r.ReceivedAt, r.Attempts, r.Deferrals, r.LockVersion, r.LastError)}
	c.ev.Handler, c.ev.DedupKey = r.Handler, r.DedupKey
	c.ev.KeySeq = seqOf(r.KeySeq)
	return c
}

func newEvent(id, topic, key, typ string, payload []byte, headers json.RawMessage, occurred, received time.Time,
	attempts, deferrals int32, version int64, lastErr *string) Event {
	ev := Event{
		Message: event.Message{
			EventID: id, Topic: topic, Key: key, EventType: typ, Payload: payload, OccurredAt: occurred,
		},
		ReceivedAt:  received,
		Attempts:    int(attempts),
		Deferrals:   int(deferrals),
		LockVersion: version,
	}
	if len(headers) > 0 {
		// Headers were written by Receive from a map[string]string; a row edited
		// by hand into another shape just yields no headers.
		_ = json.Unmarshal(headers, &ev.Headers)
		ev.LiftContentType()
		ev.LiftExpiresAt()
		ev.LiftTrace()
	}
	if lastErr != nil {
		ev.LastError = *lastErr
	}
	return ev
}
