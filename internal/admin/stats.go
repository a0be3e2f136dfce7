package admin

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"unicode/utf8"

	"github.com/pgrelay/pgrelay/internal/pooler"
	"github.com/pgrelay/pgrelay/migrations"
)

// Stats is a snapshot of the inbox (and, where installed, the outbox).
type Stats struct {
	Inbox InboxStats `json:"inbox"`
	// Outbox describes the outbox table.
	Outbox OutboxStats `json:"outbox"`
	// Dedup is derived from the process's counters; nil when Config.Counters
	// is not set (the database does not record duplicates).
	Dedup *DedupStats `json:"dedup,omitempty"`
	// AuditTableBytes is the replay audit table's size on disk.
	AuditTableBytes int64 `json:"audit_table_bytes"`
	// Ordered describes the waiting keys of ordered handlers.
	Ordered OrderedStats `json:"ordered"`
	// WALSlots lists the database's pgoutput replication slots (a
	// WAL-capture relay's, docs/wal.md); empty without one.
	WALSlots []WALSlotStats `json:"wal_slots"`
	// Schema is the database's schema version against this build's
	// migrations.
	Schema migrations.Status `json:"schema"`
}

// InboxStats describes the inbox table.
type InboxStats struct {
	// ByStatus counts rows by status; every status is present.
	ByStatus map[string]int64 `json:"by_status"`
	// Handlers counts each named handler's rows by status, with the key
	// strategies its rows were stored under.
	Handlers []HandlerStats `json:"handlers"`
	// TableBytes is the table's size on disk, indexes and TOAST included.
	// Processed rows kept for the dedup window are most of it.
	TableBytes int64 `json:"table_bytes"`
	// OldestPendingSeconds is the age of the oldest pending row (since it was
	// received), 0 when none is pending.
	OldestPendingSeconds float64 `json:"oldest_pending_seconds"`
	// OldestClaimableSeconds is how long the oldest row ready to run (pending
	// and due, or with an expired lease) has been waiting for a worker: the
	// consumer's lag. Rows backing off are not counted.
	OldestClaimableSeconds float64 `json:"oldest_claimable_seconds"`
}

// HandlerStats describes one named handler's inbox rows.
type HandlerStats struct {
	Handler string `json:"handler"`
	// KeyStrategies lists the strategies its rows were keyed by (one,
	// unless the handler's strategy changed within the dedup window).
	KeyStrategies []string `json:"key_strategies"`
	// ByStatus counts its rows by status; every status is present.
	ByStatus map[string]int64 `json:"by_status"`
}

// OutboxStats describes the outbox table.
type OutboxStats struct {
	// ByStatus counts rows by status; every status is present.
	ByStatus map[string]int64 `json:"by_status"`
	// TableBytes is the table's size on disk, indexes and TOAST included.
	TableBytes int64 `json:"table_bytes"`
	// OldestPendingSeconds is the age of the oldest pending row not backing
	// off (since its commit): the relay's lag. 0 when none.
	OldestPendingSeconds float64 `json:"oldest_pending_seconds"`
}

// OutboxStatuses lists the outbox statuses in their natural order.
var OutboxStatuses = []string{"pending", "published", "dead"}

// DedupStats reports how many deliveries the inbox absorbed as duplicates.
type DedupStats struct {
	Received   float64 `json:"received"`
	Duplicates float64 `json:"duplicates"`
	// HitRate is Duplicates / Received (0 when nothing was received).
	HitRate float64 `json:"hit_rate"`
}

// InboxStatuses lists the inbox statuses in their natural order.
var InboxStatuses = []string{"pending", "processing", "processed", "dead"}

// Stats returns the current statistics.
func (s *Service) Stats(ctx context.Context) (*Stats, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	st := &Stats{Inbox: InboxStats{ByStatus: map[string]int64{}}}
	for _, status := range InboxStatuses {
		st.Inbox.ByStatus[status] = 0
	}
	counts, err := s.q.AdminInboxStatusCounts(ctx, s.cfg.Pool)
	if err != nil {
		return nil, fmt.Errorf("admin: stats: count inbox rows: %w", err)
	}
	st.Inbox.Handlers = []HandlerStats{}
	for _, c := range counts {
		st.Inbox.ByStatus[c.Status] += c.RowCount
		n := len(st.Inbox.Handlers)
		if n == 0 || st.Inbox.Handlers[n-1].Handler != c.Handler {
			hs := HandlerStats{Handler: c.Handler, KeyStrategies: []string{}, ByStatus: map[string]int64{}}
			for _, status := range InboxStatuses {
				hs.ByStatus[status] = 0
			}
			st.Inbox.Handlers = append(st.Inbox.Handlers, hs)
			n++
		}
		h := &st.Inbox.Handlers[n-1]
		h.ByStatus[c.Status] += c.RowCount
		if !slices.Contains(h.KeyStrategies, c.KeyStrategy) {
			h.KeyStrategies = append(h.KeyStrategies, c.KeyStrategy)
		}
	}
	g, err := s.q.InboxGauges(ctx, s.cfg.Pool)
	if err != nil {
		return nil, fmt.Errorf("admin: stats: inbox gauges: %w", err)
	}
	st.Inbox.TableBytes = g.TableBytes
	st.Inbox.OldestPendingSeconds = g.OldestPendingSeconds
	st.Inbox.OldestClaimableSeconds = g.OldestClaimableSeconds
	st.Outbox.ByStatus = map[string]int64{}
	for _, status := range OutboxStatuses {
		st.Outbox.ByStatus[status] = 0
	}
	ocounts, err := s.q.AdminOutboxStatusCounts(ctx, s.cfg.Pool)
	if err != nil {
		return nil, fmt.Errorf("admin: stats: count outbox rows: %w", err)
	}
	for _, c := range ocounts {
		st.Outbox.ByStatus[c.Status] = c.RowCount
	}
	og, err := s.q.OutboxGauges(ctx, s.cfg.Pool)
	if err != nil {
		return nil, fmt.Errorf("admin: stats: outbox gauges: %w", err)
	}
	st.Outbox.TableBytes = og.TableBytes
	st.Outbox.OldestPendingSeconds = og.OldestPendingSeconds
	audit, err := s.q.AdminTableSize(ctx, s.cfg.Pool, "replay_audit")
	if err != nil {
		return nil, fmt.Errorf("admin: stats: audit table size: %w", err)
	}
	st.AuditTableBytes = audit
	if st.WALSlots, err = s.walSlots(ctx); err != nil {
		return nil, err
	}
	if st.Ordered, err = s.orderedStats(ctx); err != nil {
		return nil, err
	}
	if st.Schema, err = pooler.SchemaStatus(ctx, s.cfg.Pool); err != nil {
		return nil, fmt.Errorf("admin: stats: %w", err)
	}
	if s.cfg.Counters != nil {
		if received, dups, ok := s.cfg.Counters(); ok {
			st.Dedup = &DedupStats{Received: received, Duplicates: dups}
			if received > 0 {
				st.Dedup.HitRate = dups / received
			}
		}
	}
	return st, nil
}

func encodePayload(b []byte) (string, string) {
	if len(b) == 0 {
		return "", ""
	}
	if utf8.Valid(b) {
		return string(b), "text"
	}
	return base64.StdEncoding.EncodeToString(b), "base64"
}

func decodeHeaders(raw json.RawMessage) map[string]string {
	if len(raw) == 0 {
		return nil
	}
	var h map[string]string
	if err := json.Unmarshal(raw, &h); err != nil {
		// Headers that are not a flat string map are shown as one raw value.
		return map[string]string{"(raw)": string(raw)}
	}
	if len(h) == 0 {
		return nil
	}
	return h
}
