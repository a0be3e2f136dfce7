package inboxadapt

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgrelay/pgrelay/internal/inbox"
)

type pubEvent struct{ ID string }

type outcome string

// recorder is a public observer that also listens to sequence outcomes.
type recorder struct {
	mu   sync.Mutex
	seen []string
}

func (r *recorder) add(s string)                            { r.mu.Lock(); r.seen = append(r.seen, s); r.mu.Unlock() }
func (r *recorder) Received(int, int)                       { r.add("received") }
func (r *recorder) Claimed(int, int)                        { r.add("claimed") }
func (r *recorder) Processed(ev *pubEvent, _ time.Duration) { r.add("processed " + ev.ID) }
func (r *recorder) Retried(ev *pubEvent, _ string)          { r.add("retried " + ev.ID) }
func (r *recorder) Deferred(ev *pubEvent)                   { r.add("deferred " + ev.ID) }
func (r *recorder) Dead(ev *pubEvent, _ string)             { r.add("dead " + ev.ID) }
func (r *recorder) Fenced(ev *pubEvent)                     { r.add("fenced " + ev.ID) }
func (r *recorder) Sequence(o outcome, _ int)               { r.add("sequence " + string(o)) }

func conv(ev *inbox.Event) *pubEvent { return &pubEvent{ID: ev.EventID} }

// TestObserverKeepsTheSequenceExtension: a public observer that listens to
// sequence outcomes still does once adapted (the engine finds the extension
// by a type assertion), alone and teed with another observer.
func TestObserverKeepsTheSequenceExtension(t *testing.T) {
	r := &recorder{}
	o := NewObserver[pubEvent, outcome](r, conv)
	for name, obs := range map[string]inbox.Observer{"adapted": o, "teed": Tee(inbox.NopObserver{}, o)} {
		s, ok := obs.(inbox.SequenceObserver)
		if !ok {
			t.Fatalf("%s: the sequence extension was lost", name)
		}
		s.Sequence(inbox.SeqApplied, 1)
		obs.Processed(&inbox.Event{}, 0)
	}
	if NewObserver[pubEvent, outcome](nil, conv) != nil {
		t.Error("a nil observer adapted to a non-nil one")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	want := []string{"sequence applied_in_order", "processed ", "sequence applied_in_order", "processed "}
	if len(r.seen) != len(want) {
		t.Fatalf("seen %q, want %q", r.seen, want)
	}
}

// pubHandler is a public handler; external says whether it declares effects
// outside the database.
type pubHandler struct{}

func (pubHandler) Handle(context.Context, pgx.Tx, *pubEvent) error { return nil }

type pubExternal struct {
	pubHandler
	external bool
}

func (h pubExternal) ExternalEffects() bool { return h.external }

type pubExternalBatch struct{ pubExternal }

func (pubExternalBatch) HandleBatch(context.Context, pgx.Tx, []*pubEvent) error { return nil }

// TestHandlerKeepsExternalEffects: a public handler that declares effects
// outside the database (the engine then commits each event on its own) still
// does once adapted, batch handler or not; one that does not say, or says
// false, does not.
func TestHandlerKeepsExternalEffects(t *testing.T) {
	for name, tc := range map[string]struct {
		h    Handler[pubEvent]
		want bool
	}{
		"silent":         {pubHandler{}, false},
		"external":       {pubExternal{external: true}, true},
		"says false":     {pubExternal{external: false}, false},
		"external batch": {pubExternalBatch{pubExternal{external: true}}, true},
	} {
		e, ok := NewHandler[pubEvent](tc.h, conv).(inbox.ExternalHandler)
		if !ok {
			t.Fatalf("%s: the adapted handler does not forward ExternalEffects", name)
		}
		if got := e.ExternalEffects(); got != tc.want {
			t.Errorf("%s: ExternalEffects() = %v, want %v", name, got, tc.want)
		}
	}
}
