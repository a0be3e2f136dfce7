package inbox

import (
	"sync"
	"time"
)

// Observer is told what the inbox does, for metrics. Its methods are called
// from the worker goroutines concurrently and must not block.
type Observer interface {
	// Received reports one Receive call: rows stored and duplicates skipped.
	// Receive is a plain function with no worker, so its caller (the consumer)
	// reports it.
	Received(inserted, duplicates int)
	// Claimed reports one claim: n events claimed, of which takeovers were
	// taken over from a worker whose lease expired.
	Claimed(n, takeovers int)
	// Processed reports an event whose handler committed, and how long it ran.
	Processed(ev *Event, d time.Duration)
	// Retried reports an event put back for another attempt.
	Retried(ev *Event, reason string)
	// Deferred reports an event put back to wait for a dependency.
	Deferred(ev *Event)
	// Dead reports an event moved to the dead letter state.
	Dead(ev *Event, reason string)
	// Fenced reports an event whose claim was lost to another worker before
	// this worker finished it: this worker's side effect was rolled back.
	Fenced(ev *Event)
}

// NopObserver ignores everything. It is the default Config.Observer.
type NopObserver struct{}

// Received does nothing.
func (NopObserver) Received(int, int) {}

// Claimed does nothing.
func (NopObserver) Claimed(int, int) {}

// Processed does nothing.
func (NopObserver) Processed(*Event, time.Duration) {}

// Retried does nothing.
func (NopObserver) Retried(*Event, string) {}

// Deferred does nothing.
func (NopObserver) Deferred(*Event) {}

// Dead does nothing.
func (NopObserver) Dead(*Event, string) {}

// Fenced does nothing.
func (NopObserver) Fenced(*Event) {}

// CountingObserver is an Observer that counts, for tests and simple
// reporting. The zero value is ready to use.
type CountingObserver struct {
	mu        sync.Mutex
	counts    ObservedCounts
	deadWhy   map[string]string
	processed map[string]int
}

// ObservedCounts is a copy of the counters of a CountingObserver.
type ObservedCounts struct {
	Inserted, Duplicates, Claimed, Takeovers, Processed, Retried, Deferred, Dead, Fenced int
}

// Snapshot returns the counters.
func (s *CountingObserver) Snapshot() ObservedCounts {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts
}

// DeadReason returns the reason recorded for a dead event id, if any.
func (s *CountingObserver) DeadReason(eventID string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.deadWhy[eventID]
	return r, ok
}

// ProcessedCount returns how many times eventID was reported processed.
func (s *CountingObserver) ProcessedCount(eventID string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.processed[eventID]
}

// Received counts.
func (s *CountingObserver) Received(inserted, duplicates int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counts.Inserted += inserted
	s.counts.Duplicates += duplicates
}

// Claimed counts.
func (s *CountingObserver) Claimed(n, takeovers int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counts.Claimed += n
	s.counts.Takeovers += takeovers
}

// Processed counts.
func (s *CountingObserver) Processed(ev *Event, _ time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counts.Processed++
	if s.processed == nil {
		s.processed = map[string]int{}
	}
	s.processed[ev.EventID]++
}

// Retried counts.
func (s *CountingObserver) Retried(*Event, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counts.Retried++
}

// Deferred counts.
func (s *CountingObserver) Deferred(*Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counts.Deferred++
}

// Dead counts and remembers the reason.
func (s *CountingObserver) Dead(ev *Event, reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counts.Dead++
	if s.deadWhy == nil {
		s.deadWhy = map[string]string{}
	}
	s.deadWhy[ev.EventID] = reason
}

// Fenced counts.
func (s *CountingObserver) Fenced(*Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counts.Fenced++
}
