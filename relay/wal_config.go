package relay

import (
	"cmp"
	"fmt"
	"regexp"
	"time"
)

// Capture sources (Config.Capture).
const (
	// CaptureTable reads the outbox table: the default.
	CaptureTable = "table"
	// CaptureWAL reads the events written with pgrelay.Emit from a logical
	// replication slot (pgoutput).
	CaptureWAL = "wal"
)

// Defaults of the WAL capture.
const (
	DefaultWALSlot        = "pgrelay"
	defaultWALPublication = "pgrelay_wal"
	defaultWALStandbyPoll = time.Second
	// DefaultWALTruncateInterval is how often the streaming relay empties
	// pgrelay.outbox_wal.
	DefaultWALTruncateInterval = time.Minute
	// defaultWALLockTimeout bounds the relay's wait for pgrelay.outbox_wal's
	// lock.
	defaultWALLockTimeout = 100 * time.Millisecond
)

// walObserver receives the WAL capture's slot status (metrics.WALObserver).
type walObserver interface {
	// WALSlot reports the slot's status as of a heartbeat: the WAL it holds
	// back, the age of the oldest event not confirmed, whether this relay
	// streams it, its wal_status, and whether a gap stops the capture.
	WALSlot(lagBytes int64, lagSeconds float64, reading bool, walStatus string, gap bool)
	// WALRejected reports a message with pgrelay's prefix skipped, never
	// published, because no allowed producer signed it (reason: unsigned,
	// unknown_key or bad_signature; docs/wal.md#who-can-publish).
	WALRejected(reason string)
}

// WALSlotStatus is the replication slot's status as a relay saw it.
type WALSlotStatus struct {
	// Slot is the slot's name.
	Slot string `json:"slot"`
	// Exists is false when the slot is missing.
	Exists bool `json:"exists"`
	// Reading is true when this relay streams the slot (false: a standby).
	Reading bool `json:"reading"`
	// Active is true when some relay streams the slot.
	Active bool `json:"active"`
	// WALStatus is pg_replication_slots.wal_status: reserved, extended,
	// unreserved or lost.
	WALStatus string `json:"wal_status"`
	// LagBytes is how much WAL the slot holds back: the server's current
	// position less the slot's confirmed position.
	LagBytes int64 `json:"lag_bytes"`
	// LagSeconds is the age of the oldest committed event read and not yet
	// confirmed by this relay (0 when none, or when a standby).
	LagSeconds float64 `json:"lag_seconds"`
	// ConfirmedLSN is the last position this relay confirmed.
	ConfirmedLSN string `json:"confirmed_lsn,omitempty"`
	// Gap names the gap no operator accepted that stops the capture
	// (docs/wal.md#failover); empty when none.
	Gap string `json:"gap,omitempty"`
	// At is when the status was taken.
	At time.Time `json:"at"`
}

// slotName is the rule for slot and publication names: PostgreSQL's for
// slots (lower-case letters, digits and underscores, at most 63).
var slotName = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

func (c Config) captureDefaults() Config {
	c.Capture = cmp.Or(c.Capture, CaptureTable)
	c.WALSlot = cmp.Or(c.WALSlot, DefaultWALSlot)
	c.walPublication = cmp.Or(c.walPublication, defaultWALPublication)
	c.walStandbyPoll = or(c.walStandbyPoll, defaultWALStandbyPoll)
	c.WALTruncateInterval = or(c.WALTruncateInterval, DefaultWALTruncateInterval)
	c.walLockTimeout = or(c.walLockTimeout, defaultWALLockTimeout)
	return c
}

func (c Config) validateCapture() error {
	switch {
	case c.Capture != CaptureTable && c.Capture != CaptureWAL:
		return bad("Capture", "{} must be %q or %q, got %q", CaptureTable, CaptureWAL, c.Capture)
	case c.Capture != CaptureWAL:
		return nil
	case !slotName.MatchString(c.WALSlot):
		return bad("WALSlot", "{} must be 1 to 63 lower-case letters, digits and underscores, got %q", c.WALSlot)
	case !slotName.MatchString(c.walPublication):
		return fmt.Errorf("relay: the WAL publication must be 1 to 63 lower-case letters, digits and underscores, got %q", c.walPublication)
	}
	return nil
}
