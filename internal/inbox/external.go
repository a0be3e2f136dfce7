package inbox

import "context"

// ExternalHandler is a Handler whose effect lies outside the database (a
// webhook call, an email, a payment provider's API), where rolling back the
// transaction does not undo it. ExternalEffects reports whether that is so
// (a wrapper reports what the handler it wraps does).
//
// The worker normally runs a batch in one transaction and, when one event of
// it fails, rolls that transaction back and runs the batch again event by
// event (runBatch): that is right for effects in tx, which the rollback
// undid, but would repeat every external call that had already succeeded.
// For a handler whose ExternalEffects is true the worker instead commits
// each event on its own (runEach: one transaction per event, the handler,
// its processed mark, the commit), so that a call that succeeded is committed as
// processed before the next event starts, and nothing the inbox does later
// repeats it. ReceiveApply applies nothing for such a handler (the receiving
// transaction may still roll back after the call), and a BatchHandler's
// HandleBatch is not used.
//
// What remains is inherent to an effect outside the transaction: a crash, a
// lost connection or a failed commit between the call's success and the
// commit of its mark, or a takeover of an event whose lease expired during
// the call, runs the event again. The receiver must absorb that repeat (the
// HTTP handler's Idempotency-Key is the event id, the same on every attempt).
type ExternalHandler interface {
	Handler
	ExternalEffects() bool
}

// external reports whether h declares effects outside the database.
func external(h Handler) bool {
	e, ok := h.(ExternalHandler)
	return ok && e.ExternalEffects()
}

// runEach processes evs one transaction each (see ExternalHandler) until
// stopEarly says so, and returns the committed outcomes and the events it did
// not start. When an event's transaction fails it stops there: failed is that
// event, whose state the caller repairs (recover), and the events after it
// are in rest.
func (w *Worker) runEach(ctx context.Context, evs []*Event, stopEarly func() bool) (
	results []result, rest []*Event, failed *Event, err error) {
	// Ordered mode: once one of a key's events did not commit, its later
	// events of the batch are handed back unstarted.
	blocked := map[string]bool{}
	for i, ev := range evs {
		if stopEarly() {
			return results, append(rest, evs[i:]...), nil, nil
		}
		if ev.KeySeq > 0 && blocked[ev.Key] {
			rest = append(rest, ev)
			continue
		}
		rs, more, err := w.runIsolated(ctx, []*Event{ev}, stopEarly, nil)
		if err != nil {
			return results, append(rest, evs[i+1:]...), ev, err
		}
		results = append(results, rs...)
		rest = append(rest, more...)
		if w.cfg.Ordered && ev.KeySeq > 0 && !applied(rs, ev) {
			blocked[ev.Key] = true
		}
	}
	return results, rest, nil, nil
}

// applied reports whether rs says ev was processed or absorbed as a duplicate
// sequence.
func applied(rs []result, ev *Event) bool {
	for _, r := range rs {
		if r.ev == ev {
			return r.processed || r.absorbed
		}
	}
	return false // held back by the gate: out of order
}
