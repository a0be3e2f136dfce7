package relay

import (
	"regexp"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Capture sources (Config.Capture).
const (
	// CaptureTable reads the outbox table: the default.
	CaptureTable = "table"
	// CaptureWAL reads the events written with pgrelay.Emit from a logical
	// replication slot (pgoutput).
	CaptureWAL = "wal"
)

// Defaults for WALConfig.
const (
	DefaultWALSlot        = "pgrelay"
	DefaultWALPublication = "pgrelay_wal"
	DefaultWALStandbyPoll = time.Second
	// DefaultWALTruncateInterval is how often the streaming relay empties
	// pgrelay.outbox_wal.
	DefaultWALTruncateInterval = time.Minute
	// DefaultWALLockTimeout bounds the relay's wait for pgrelay.outbox_wal's
	// lock.
	DefaultWALLockTimeout = 100 * time.Millisecond
)

// WALConfig configures the WAL capture (Config.Capture CaptureWAL).
type WALConfig struct {
	// Slot names the logical replication slot the relay reads (created with
	// the pgoutput plugin when missing). One relay streams it at a time; the
	// others wait as standbys. Default DefaultWALSlot ("pgrelay").
	Slot string
	// Publication names the publication pgoutput is given (created when
	// missing, publishing the inserts into pgrelay.outbox_wal and nothing
	// else: the relay reads the emitted messages and those inserts).
	// Default DefaultWALPublication ("pgrelay_wal").
	Publication string
	// AllowUnboundedSlot lets the relay create its slot while the server's
	// max_slot_wal_keep_size is -1 (unlimited): a relay stopped for long
	// then keeps every WAL segment until the disk fills. Default false: the
	// relay refuses to create the slot.
	AllowUnboundedSlot bool
	// ConnConfig is the replication connection's settings (the relay adds
	// replication=database). Default: Config.ListenConnConfig's, else the
	// Pool's. It must reach PostgreSQL itself, not a pooler.
	ConnConfig *pgconn.Config
	// StandbyPoll is how often a standby relay tries to start streaming the
	// slot while another relay streams it. Default 1s.
	StandbyPoll time.Duration
	// Observer receives the slot's status (lag, wal_status) after each
	// heartbeat. Default: none.
	Observer WALObserver
	// TruncateInterval is how often the streaming relay empties
	// pgrelay.outbox_wal with TRUNCATE: the events are in the WAL once
	// committed, the rows are only their vehicle (docs/wal.md). Default
	// DefaultWALTruncateInterval (1m); negative: never.
	TruncateInterval time.Duration
	// LockTimeout bounds how long the relay waits for pgrelay.outbox_wal's
	// lock to empty the table or to add it to the publication; producers
	// inserting meanwhile queue behind it at most this long. A timed-out
	// attempt is retried later. Default DefaultWALLockTimeout (100ms).
	LockTimeout time.Duration
}

// WALObserver receives the WAL capture's slot status.
type WALObserver interface {
	// WALSlot reports the slot's status as of a heartbeat.
	WALSlot(s WALSlotStatus)
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
	if c.Capture == "" {
		c.Capture = CaptureTable
	}
	if c.WAL.Slot == "" {
		c.WAL.Slot = DefaultWALSlot
	}
	if c.WAL.Publication == "" {
		c.WAL.Publication = DefaultWALPublication
	}
	if c.WAL.StandbyPoll == 0 {
		c.WAL.StandbyPoll = DefaultWALStandbyPoll
	}
	if c.WAL.TruncateInterval == 0 {
		c.WAL.TruncateInterval = DefaultWALTruncateInterval
	}
	if c.WAL.LockTimeout == 0 {
		c.WAL.LockTimeout = DefaultWALLockTimeout
	}
	return c
}

func (c Config) validateCapture() error {
	switch {
	case c.Capture != CaptureTable && c.Capture != CaptureWAL:
		return bad("Capture", "{} must be %q or %q, got %q", CaptureTable, CaptureWAL, c.Capture)
	case c.Capture != CaptureWAL:
		return nil
	case !slotName.MatchString(c.WAL.Slot):
		return bad("WAL.Slot", "{} must be 1 to 63 lower-case letters, digits and underscores, got %q", c.WAL.Slot)
	case !slotName.MatchString(c.WAL.Publication):
		return bad("WAL.Publication", "{} must be 1 to 63 lower-case letters, digits and underscores, got %q", c.WAL.Publication)
	case c.WAL.StandbyPoll <= 0:
		return bad("WAL.StandbyPoll", "{} must be positive, got %s", c.WAL.StandbyPoll)
	case c.WAL.LockTimeout < time.Millisecond:
		return bad("WAL.LockTimeout", "{} must be at least 1ms, got %s", c.WAL.LockTimeout)
	}
	return nil
}
