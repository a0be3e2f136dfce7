package pgrelay

import "github.com/pgrelay/pgrelay/internal/inbox"

// Ordered apply (InboxConfig.Ordered, ConsumerConfig.Ordered): see the README,
// "Ordered apply".

// SeqOutcome is what ordered apply did with an event (applied_in_order,
// duplicate_seq, out_of_order, ...), counted by a SequenceObserver.
type SeqOutcome = inbox.SeqOutcome

// SequenceObserver is an optional extension of InboxObserver: an observer that
// implements it is told the sequence outcomes of ordered apply.
type SequenceObserver = inbox.SequenceObserver

// SequenceError says why ordered apply did not apply an event: its outcome,
// key, sequence and the sequence the key expected. It matches
// ErrDuplicateSeq, ErrOutOfOrderSeq or ErrSeqFenced with errors.Is.
type SequenceError = inbox.SequenceError

// The typed sequence errors.
var (
	ErrDuplicateSeq  = inbox.ErrDuplicateSeq
	ErrOutOfOrderSeq = inbox.ErrOutOfOrderSeq
	ErrSeqFenced     = inbox.ErrSeqFenced
)

// WaitingKey is a key of an ordered handler whose events wait (ListWaiting).
type WaitingKey = inbox.WaitingKey

// ListWaiting returns up to limit keys of ordered handlers whose events wait
// (of handler, or of every handler when it is empty): why (gap, parked,
// behind), the sequence they wait for and how many events are held.
var ListWaiting = inbox.ListWaiting
