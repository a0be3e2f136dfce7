// Package inboxtest holds test helpers for inbox workers: an InboxObserver
// that counts what it is told.
package inboxtest

import (
	"sync"
	"time"

	"github.com/pgrelay/pgrelay"
)

// CountingObserver is an InboxObserver that counts, for tests and simple
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
func (s *CountingObserver) Processed(ev *pgrelay.InboxEvent, _ time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counts.Processed++
	if s.processed == nil {
		s.processed = map[string]int{}
	}
	s.processed[ev.EventID]++
}

// Retried counts.
func (s *CountingObserver) Retried(*pgrelay.InboxEvent, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counts.Retried++
}

// Deferred counts.
func (s *CountingObserver) Deferred(*pgrelay.InboxEvent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counts.Deferred++
}

// Dead counts and remembers the reason.
func (s *CountingObserver) Dead(ev *pgrelay.InboxEvent, reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counts.Dead++
	if s.deadWhy == nil {
		s.deadWhy = map[string]string{}
	}
	s.deadWhy[ev.EventID] = reason
}

// Fenced counts.
func (s *CountingObserver) Fenced(*pgrelay.InboxEvent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counts.Fenced++
}
