package relay

import "time"

// relayObserver receives the relay's metrics events. Implementations must be safe
// for concurrent use and return quickly.
type relayObserver interface {
	// Published reports n events acknowledged by the broker and marked
	// published, duplicates of them reported as such by the broker, and the
	// lag between the oldest one's commit and its publication.
	Published(partition int, n, duplicates int, lag time.Duration)
	// PublishDuration reports how long publishing a batch of n events took,
	// from the first send to the last acknowledgement or failure.
	PublishDuration(partition int, n int, d time.Duration)
	// PublishFailed reports a transient failure that left n events pending.
	PublishFailed(partition int, n int, err error)
	// MarkedDead reports n events the broker rejected for good, marked dead.
	MarkedDead(partition int, n int)
	// Expired reports n events whose expires_at passed before they were
	// published, marked dead with the reason "expired".
	Expired(partition int, n int)
	// Fenced reports a mark refused because another relay took the
	// partition over (its epoch moved on).
	Fenced(partition int)
	// LeaseAcquired reports a partition acquired at epoch; takenOver is set
	// when it was taken from a relay whose lease had expired.
	LeaseAcquired(partition int, epoch int64, takenOver bool)
	// LeaseLost reports a partition this relay found owned by another.
	LeaseLost(partition int)
	// PartitionsHeld reports, after each heartbeat, how many partitions this
	// relay holds and works.
	PartitionsHeld(n int)
	// StandbyWait reports that the partition's batch waits, since since,
	// for the standbys of Config.StandbyNames to flush its commits; a zero
	// since reports that the wait ended.
	StandbyWait(partition int, since time.Time)
}

// nopObserver is an observer that ignores everything.
type nopObserver struct{}

// Published implements relayObserver.
func (nopObserver) Published(int, int, int, time.Duration) {}

// PublishDuration implements relayObserver.
func (nopObserver) PublishDuration(int, int, time.Duration) {}

// PublishFailed implements relayObserver.
func (nopObserver) PublishFailed(int, int, error) {}

// MarkedDead implements relayObserver.
func (nopObserver) MarkedDead(int, int) {}

// Expired implements relayObserver.
func (nopObserver) Expired(int, int) {}

// Fenced implements relayObserver.
func (nopObserver) Fenced(int) {}

// LeaseAcquired implements relayObserver.
func (nopObserver) LeaseAcquired(int, int64, bool) {}

// LeaseLost implements relayObserver.
func (nopObserver) LeaseLost(int) {}

// PartitionsHeld implements relayObserver.
func (nopObserver) PartitionsHeld(int) {}

// StandbyWait implements relayObserver.
func (nopObserver) StandbyWait(int, time.Time) {}
