// Package tui is pgrelay's operator console (relay tui, consumer tui): a
// bubbletea program that shows the dedup record, the inbox keys, the outbox
// partitions and the effective settings with advice, refreshed live, and runs
// the operator operations of internal/admin (purge, statistics reset) after a
// confirmation, audited like the CLI.
//
// The Model is pure: data arrives as messages (Snapshot) and operations run as
// commands, so Update and View are tested by feeding messages.
package tui

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/pgrelay/pgrelay/internal/admin"
)

// StreamInfo is what the console knows of the JetStream stream the consumer
// reads.
type StreamInfo struct {
	Name string `json:"name"`
	// MaxAge is the stream's message age limit; 0 means unlimited.
	MaxAge time.Duration `json:"max_age"`
	// Duplicates is the stream's duplicate window.
	Duplicates time.Duration `json:"duplicates_window"`
	Messages   uint64        `json:"messages"`
}

// ProcessCounters are a running consumer's own counters, read from its
// metrics endpoint (since that process started).
type ProcessCounters struct {
	Received   float64 `json:"received"`
	Duplicates float64 `json:"duplicates"`
}

// Snapshot is one refresh's data: the selected database's, and with several
// databases a row of each. A part that could not be read is nil and its error
// is in Errors.
type Snapshot struct {
	At time.Time `json:"at"`
	// Database is the selected database's name ("" when it is the only one).
	Database string `json:"database,omitempty"`
	// Databases are every database's row, with several; else empty.
	Databases []DatabaseRow         `json:"databases,omitempty"`
	Stats     *admin.Stats          `json:"stats,omitempty"`
	Dedup     *admin.DedupReport    `json:"dedup,omitempty"`
	Keys      []admin.InboxKey      `json:"keys,omitempty"`
	Outbox    *admin.OutboxOverview `json:"outbox,omitempty"`
	Stream    *StreamInfo           `json:"stream,omitempty"`
	Process   *ProcessCounters      `json:"process,omitempty"`
	Errors    []string              `json:"errors,omitempty"`
}

// DatabaseRow is one database's line of the databases panel: its counts by
// status and lags (Stats), or why they could not be read (Error).
type DatabaseRow struct {
	Name  string       `json:"name"`
	Stats *admin.Stats `json:"stats,omitempty"`
	Error string       `json:"error,omitempty"`
}

// Database is one database the console shows.
type Database struct {
	// Name tells it apart from the others; "" when it is the only one.
	Name string
	// Admin runs the reads and the operator operations. Required.
	Admin *admin.Service
	// Retention runs inbox retention once and returns the rows deleted (the
	// f key). Default nil: f reports that retention is unavailable.
	Retention func(ctx context.Context) (int64, error)
}

// Config configures the console.
type Config struct {
	// Service names the program ("consumer" or "relay"), shown in the title.
	Service string
	// Databases are the databases shown, in order; the first is selected
	// at the start. At least one.
	Databases []Database
	// Stream reads the stream's settings. Default nil: unknown.
	Stream func(ctx context.Context) (*StreamInfo, error)
	// Counters reads a consumer's process counters (its metrics endpoint).
	// Default nil: not shown.
	Counters func() (received, duplicates float64, ok bool)
	// Settings are the effective settings shown in the config panel, in
	// order.
	Settings []Setting
	// DedupWindow is the inbox's dedup window (retention). Default
	// retention's default.
	DedupWindow time.Duration
	// DedupRecordMax is the duplicate record's cap.
	DedupRecordMax int
	// Actor is recorded in the audit table for each operation. Required.
	Actor string
	// ExportDir is where s writes its JSON file. Default ".".
	ExportDir string
	// Refresh is the refresh interval. Default 2s.
	Refresh time.Duration
	// Timeout bounds one refresh or operation. Default 10s.
	Timeout time.Duration
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// Setting is one effective setting.
type Setting struct {
	Name, Value string
}

// WithDefaults returns a copy of c with every unset field at its default.
func (c Config) WithDefaults() Config {
	if c.Service == "" {
		c.Service = "consumer"
	}
	if c.ExportDir == "" {
		c.ExportDir = "."
	}
	if c.Refresh == 0 {
		c.Refresh = 2 * time.Second
	}
	if c.Timeout == 0 {
		c.Timeout = 10 * time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

func (c Config) validate() error {
	if len(c.Databases) == 0 {
		return errors.New("tui: Config.Databases is required")
	}
	for i, d := range c.Databases {
		if d.Admin == nil {
			return fmt.Errorf("tui: Config.Databases[%d].Admin is required", i)
		}
		if len(c.Databases) > 1 && d.Name == "" {
			return fmt.Errorf("tui: Config.Databases[%d] has no Name: several databases are told apart by it", i)
		}
	}
	switch {
	case c.Actor == "":
		return errors.New("tui: Config.Actor is required (it is recorded in the audit table)")
	case c.Refresh < 100*time.Millisecond:
		return fmt.Errorf("tui: the refresh interval (--refresh) must be at least 100ms, got %s", c.Refresh)
	case c.Timeout <= 0:
		return fmt.Errorf("tui: Config.Timeout must be positive, got %s", c.Timeout)
	}
	return nil
}

// load reads one snapshot of database db (an index of cfg.Databases). Each
// part fails on its own.
func load(ctx context.Context, cfg Config, db int, search string) *Snapshot {
	d := cfg.Databases[db]
	snap := &Snapshot{At: cfg.Now(), Database: d.Name}
	fail := func(what string, err error) {
		snap.Errors = append(snap.Errors, what+": "+err.Error())
	}
	var err error
	if snap.Stats, err = d.Admin.Stats(ctx); err != nil {
		fail("stats", err)
	}
	if len(cfg.Databases) > 1 {
		statsErr := err
		for i, other := range cfg.Databases {
			st, err := snap.Stats, statsErr
			if i != db {
				st, err = other.Admin.Stats(ctx)
			}
			row := DatabaseRow{Name: other.Name, Stats: st}
			if err != nil {
				row.Error = err.Error()
			}
			snap.Databases = append(snap.Databases, row)
		}
	}
	if snap.Dedup, err = d.Admin.Dedup(ctx, 50); err != nil {
		fail("dedup", err)
	}
	if snap.Keys, err = d.Admin.InboxKeys(ctx, search, 100); err != nil {
		fail("keys", err)
	}
	if snap.Outbox, err = d.Admin.Outbox(ctx); err != nil {
		fail("outbox", err)
	}
	if cfg.Stream != nil {
		if snap.Stream, err = cfg.Stream(ctx); err != nil {
			fail("stream", err)
		}
	}
	if cfg.Counters != nil {
		if r, d, ok := cfg.Counters(); ok {
			snap.Process = &ProcessCounters{Received: r, Duplicates: d}
		} else {
			snap.Errors = append(snap.Errors, "metrics: the consumer's metrics endpoint cannot be read")
		}
	}
	return snap
}

// export writes snap as indented JSON into dir and returns the file's path.
func export(dir string, snap *Snapshot) (string, error) {
	if snap == nil {
		return "", errors.New("nothing loaded yet")
	}
	b, err := json.MarshalIndent(snap, "", "  ")
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "pgrelay-stats-"+snap.At.UTC().Format("20060102T150405.000Z")+".json")
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return "", err
	}
	return path, nil
}

// Advise returns the advice the console derives from a snapshot and the
// settings, most important first; never empty.
func Advise(snap *Snapshot, window time.Duration, recordMax int) []string {
	var out []string
	if snap == nil {
		return []string{"loading…"}
	}
	if s := snap.Stream; s != nil {
		switch {
		case s.MaxAge == 0:
			out = append(out, fmt.Sprintf("stream %s keeps messages forever (no MaxAge): longer than the dedup window %s; a replay could apply old events twice: set the stream's MaxAge at most %s", s.Name, fmtDur(window), fmtDur(window)))
		case s.MaxAge > window:
			out = append(out, fmt.Sprintf("dedup window %s shorter than the stream's MaxAge %s: a replay could apply events twice; raise --dedup-window or lower MaxAge", fmtDur(window), fmtDur(s.MaxAge)))
		}
		if s.Duplicates > window {
			out = append(out, fmt.Sprintf("stream duplicate window %s longer than the dedup window %s", fmtDur(s.Duplicates), fmtDur(window)))
		}
	} else {
		out = append(out, "stream settings unknown: pass --nats-url to check the dedup window against the stream's MaxAge")
	}
	if d := snap.Dedup; d != nil {
		if d.Received >= 20 && d.HitRate >= 0.05 {
			out = append(out, fmt.Sprintf("duplicate rate %.1f%% over 24h: redeliveries are frequent; check the ack wait against the time a batch takes to store, and relay restarts", d.HitRate*100))
		}
		if recordMax > 0 && d.RecordRows >= int64(recordMax) {
			out = append(out, fmt.Sprintf("the duplicate record is at its cap (%d): the feed covers only the newest; raise --dedup-record-max to keep more", recordMax))
		}
	}
	if st := snap.Stats; st != nil {
		if n := st.Inbox.ByStatus["dead"]; n > 0 {
			out = append(out, fmt.Sprintf("%d dead inbox event(s): inspect them in Keys (Enter); purge with d, or requeue with `consumer dead requeue`", n))
		}
		if st.Inbox.OldestClaimableSeconds > 60 {
			out = append(out, fmt.Sprintf("consumer lag %s: the workers are behind; add workers or check the handler", fmtDur(secs(st.Inbox.OldestClaimableSeconds))))
		}
		if pending := st.Outbox.ByStatus["pending"]; pending > 0 && snap.Outbox != nil && alive(snap.Outbox) == 0 {
			out = append(out, fmt.Sprintf("outbox has %d pending row(s) and no relay is alive", pending))
		}
		if st.Outbox.OldestPendingSeconds > 60 {
			out = append(out, fmt.Sprintf("relay lag %s: the oldest pending outbox row waits", fmtDur(secs(st.Outbox.OldestPendingSeconds))))
		}
	}
	if len(out) == 0 {
		out = append(out, "nothing to tune: the settings look consistent")
	}
	return out
}

func alive(ov *admin.OutboxOverview) int {
	n := 0
	for _, r := range ov.Relays {
		if r.Alive {
			n++
		}
	}
	return n
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
