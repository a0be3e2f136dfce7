package pgrelay

import (
	"context"
	"time"

	"github.com/pgrelay/pgrelay/internal/inbox"
)

// SeqOutcome is what ordered apply (InboxConfig.Ordered) did with an event
// (or, for SeqGapReported, with a key), counted by a SequenceObserver.
type SeqOutcome string

// The sequence outcomes.
const (
	// SeqApplied: the event ran and committed, in its key's order.
	SeqApplied SeqOutcome = SeqOutcome(inbox.SeqApplied)
	// SeqDuplicate: the event's sequence was already applied for its key;
	// absorbed without running the handler.
	SeqDuplicate SeqOutcome = SeqOutcome(inbox.SeqDuplicate)
	// SeqOutOfOrder: the event was claimed while an earlier sequence of its
	// key was unapplied; handed back without running.
	SeqOutOfOrder SeqOutcome = SeqOutcome(inbox.SeqOutOfOrder)
	// SeqHeld: an event was made to wait for an earlier sequence.
	SeqHeld SeqOutcome = SeqOutcome(inbox.SeqHeld)
	// SeqGapReported: a key waited longer than InboxConfig.GapTimeout for a
	// sequence that never arrived.
	SeqGapReported SeqOutcome = SeqOutcome(inbox.SeqGapReported)
	// SeqGapSkipped: an operator skipped a gap.
	SeqGapSkipped SeqOutcome = SeqOutcome(inbox.SeqGapSkipped)
	// SeqDeadSkipped: an operator skipped a dead event of an ordered key.
	SeqDeadSkipped SeqOutcome = SeqOutcome(inbox.SeqDeadSkipped)
	// SeqParked: an event with a sequence went dead; its key waits.
	SeqParked SeqOutcome = SeqOutcome(inbox.SeqParked)
	// SeqFenced: the event was taken over by another worker before its apply
	// committed; this worker's effect was rolled back.
	SeqFenced SeqOutcome = SeqOutcome(inbox.SeqFenced)
	// SeqUnsequenced: an event without a sequence, applied unordered.
	SeqUnsequenced SeqOutcome = SeqOutcome(inbox.SeqUnsequenced)
)

// SequenceObserver is an optional extension of InboxObserver: an observer that
// implements it is told the sequence outcomes of ordered apply.
type SequenceObserver interface {
	Sequence(o SeqOutcome, n int)
}

// WaitingKey is a key of an ordered handler whose events wait (ListWaiting).
type WaitingKey struct {
	Handler string `json:"handler"`
	Key     string `json:"key"`
	// LastApplied is the highest sequence applied; WaitingFor the next one.
	LastApplied int64 `json:"last_applied"`
	WaitingFor  int64 `json:"waiting_for_seq"`
	// State is "gap" (WaitingFor never arrived), "parked" (it is dead) or
	// "behind" (it is pending, retrying or in flight).
	State string `json:"state"`
	// Held is how many later events wait; FirstHeld the lowest of them.
	Held      int64     `json:"held"`
	FirstHeld int64     `json:"first_held_seq,omitempty"`
	Oldest    time.Time `json:"oldest"`
	// GapSince is when the gap was first seen (nil unless State is "gap"
	// and a scan saw it); Reported when it was reported.
	GapSince *time.Time `json:"gap_since,omitempty"`
	Reported *time.Time `json:"gap_reported_at,omitempty"`
}

// ListWaiting returns up to limit keys of ordered handlers whose events wait
// (of handler, or of every handler when it is empty): why (gap, parked,
// behind), the sequence they wait for and how many events are held.
func ListWaiting(ctx context.Context, q DBTX, handler string, limit int) ([]WaitingKey, error) {
	ks, err := inbox.ListWaiting(ctx, q, handler, limit)
	out := make([]WaitingKey, len(ks))
	for i, k := range ks {
		out[i] = WaitingKey(k)
	}
	return out, err
}
