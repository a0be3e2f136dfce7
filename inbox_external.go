package pgrelay

import "context"

// external reports whether h declares effects outside the database.
func external(h InboxHandler) bool {
	e, ok := h.(ExternalHandler)
	return ok && e.ExternalEffects()
}

// runEach processes evs one transaction each (see ExternalHandler) until
// stopEarly says so, and returns the committed outcomes and the events it did
// not start. When an event's transaction fails it stops there: failed is that
// event, whose state the caller repairs (recover), and the events after it
// are in rest.
func (w *InboxWorker) runEach(ctx context.Context, evs []*InboxEvent, stopEarly func() bool) (
	results []result, rest []*InboxEvent, failed *InboxEvent, err error) {
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
		rs, more, err := w.runIsolated(ctx, []*InboxEvent{ev}, stopEarly, nil)
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
func applied(rs []result, ev *InboxEvent) bool {
	for _, r := range rs {
		if r.ev == ev {
			return r.processed || r.absorbed
		}
	}
	return false // held back by the gate: out of order
}
