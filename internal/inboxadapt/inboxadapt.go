// Package inboxadapt adapts the public handler and observer types (of the
// root package and the consumer package, which declare their own event type)
// to the inbox engine's, converting each event as it is handed over.
package inboxadapt

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgrelay/pgrelay/internal/inbox"
)

// Handler is a public handler of events of type E.
type Handler[E any] interface {
	Handle(ctx context.Context, tx pgx.Tx, ev *E) error
}

// BatchHandler is a public batch handler of events of type E.
type BatchHandler[E any] interface {
	Handler[E]
	HandleBatch(ctx context.Context, tx pgx.Tx, evs []*E) error
}

// Conv converts an engine event to the public type.
type Conv[E any] func(*inbox.Event) *E

// NewHandler returns the engine handler running h, a batch handler when h is
// one; nil for a nil h (the engine then reports the missing handler).
func NewHandler[E any](h Handler[E], conv Conv[E]) inbox.Handler {
	if h == nil {
		return nil
	}
	base := handler[E]{h: h, conv: conv}
	if bh, ok := h.(BatchHandler[E]); ok {
		return batchHandler[E]{handler: base, bh: bh}
	}
	return base
}

type handler[E any] struct {
	h    Handler[E]
	conv Conv[E]
}

func (a handler[E]) Handle(ctx context.Context, tx pgx.Tx, ev *inbox.Event) error {
	return a.h.Handle(ctx, tx, a.conv(ev))
}

// ExternalEffects reports what the public handler reports
// (inbox.ExternalHandler): false when it does not say.
func (a handler[E]) ExternalEffects() bool {
	e, ok := a.h.(interface{ ExternalEffects() bool })
	return ok && e.ExternalEffects()
}

type batchHandler[E any] struct {
	handler[E]
	bh BatchHandler[E]
}

func (a batchHandler[E]) HandleBatch(ctx context.Context, tx pgx.Tx, evs []*inbox.Event) error {
	out := make([]*E, len(evs))
	for i, ev := range evs {
		out[i] = a.conv(ev)
	}
	return a.bh.HandleBatch(ctx, tx, out)
}

// Observer is a public inbox observer of events of type E.
type Observer[E any] interface {
	Received(inserted, duplicates int)
	Claimed(n, takeovers int)
	Processed(ev *E, d time.Duration)
	Retried(ev *E, reason string)
	Deferred(ev *E)
	Dead(ev *E, reason string)
	Fenced(ev *E)
}

// SequenceObserver is the public ordered-apply extension of an Observer, O
// being the public outcome type.
type SequenceObserver[O ~string] interface {
	Sequence(o O, n int)
}

// NewObserver returns the engine observer telling o, one that also listens to
// sequence outcomes when o does; nil for a nil o.
func NewObserver[E any, O ~string](o Observer[E], conv Conv[E]) inbox.Observer {
	if o == nil {
		return nil
	}
	base := observer[E]{o: o, conv: conv}
	if so, ok := o.(SequenceObserver[O]); ok {
		return seqObserver[E, O]{observer: base, so: so}
	}
	return base
}

type observer[E any] struct {
	o    Observer[E]
	conv Conv[E]
}

func (a observer[E]) Received(inserted, duplicates int)          { a.o.Received(inserted, duplicates) }
func (a observer[E]) Claimed(n, takeovers int)                   { a.o.Claimed(n, takeovers) }
func (a observer[E]) Processed(ev *inbox.Event, d time.Duration) { a.o.Processed(a.conv(ev), d) }
func (a observer[E]) Retried(ev *inbox.Event, reason string)     { a.o.Retried(a.conv(ev), reason) }
func (a observer[E]) Deferred(ev *inbox.Event)                   { a.o.Deferred(a.conv(ev)) }
func (a observer[E]) Dead(ev *inbox.Event, reason string)        { a.o.Dead(a.conv(ev), reason) }
func (a observer[E]) Fenced(ev *inbox.Event)                     { a.o.Fenced(a.conv(ev)) }

type seqObserver[E any, O ~string] struct {
	observer[E]
	so SequenceObserver[O]
}

func (a seqObserver[E, O]) Sequence(o inbox.SeqOutcome, n int) { a.so.Sequence(O(o), n) }

// Tee returns an observer telling a and then b (b may be nil), passing
// sequence outcomes on to those that listen to them.
func Tee(a, b inbox.Observer) inbox.Observer {
	if b == nil {
		return a
	}
	return tee{a, b}
}

type tee struct{ a, b inbox.Observer }

func (t tee) Received(inserted, duplicates int) {
	t.a.Received(inserted, duplicates)
	t.b.Received(inserted, duplicates)
}
func (t tee) Claimed(n, takeovers int) { t.a.Claimed(n, takeovers); t.b.Claimed(n, takeovers) }
func (t tee) Processed(ev *inbox.Event, d time.Duration) {
	t.a.Processed(ev, d)
	t.b.Processed(ev, d)
}
func (t tee) Retried(ev *inbox.Event, reason string) {
	t.a.Retried(ev, reason)
	t.b.Retried(ev, reason)
}
func (t tee) Deferred(ev *inbox.Event)            { t.a.Deferred(ev); t.b.Deferred(ev) }
func (t tee) Dead(ev *inbox.Event, reason string) { t.a.Dead(ev, reason); t.b.Dead(ev, reason) }
func (t tee) Fenced(ev *inbox.Event)              { t.a.Fenced(ev); t.b.Fenced(ev) }
func (t tee) Sequence(o inbox.SeqOutcome, n int) {
	for _, x := range []inbox.Observer{t.a, t.b} {
		if s, ok := x.(inbox.SequenceObserver); ok {
			s.Sequence(o, n)
		}
	}
}
