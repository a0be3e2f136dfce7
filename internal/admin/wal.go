package admin

import (
	"context"
	"fmt"
)

// WALSlotStats describes a logical replication slot of this database that
// uses pgoutput: a WAL-capture relay's (docs/wal.md).
type WALSlotStats struct {
	Slot string `json:"slot"`
	// Active is true while a relay streams the slot.
	Active bool `json:"active"`
	// WALStatus is pg_replication_slots.wal_status: reserved, extended,
	// unreserved or lost.
	WALStatus string `json:"wal_status"`
	// LagBytes is the WAL the slot holds back: the server's current position
	// less the slot's confirmed position.
	LagBytes int64 `json:"lag_bytes"`
	// SafeWALSizeBytes is how much more WAL can be written before the slot
	// is lost (pg_replication_slots.safe_wal_size); nil when
	// max_slot_wal_keep_size is unlimited.
	SafeWALSizeBytes *int64 `json:"safe_wal_size_bytes"`
}

// walSlots lists the database's pgoutput slots. sqlc's catalog has no
// system views: the statement stays here.
func (s *Service) walSlots(ctx context.Context) ([]WALSlotStats, error) {
	rows, err := s.cfg.Pool.Query(ctx, `SELECT slot_name::text, active, coalesce(wal_status, ''),
		coalesce(pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), confirmed_flush_lsn), 0)::bigint, safe_wal_size
		FROM pg_replication_slots WHERE database = pg_catalog.current_database() AND plugin = 'pgoutput' ORDER BY slot_name`)
	if err != nil {
		return nil, fmt.Errorf("admin: stats: replication slots: %w", err)
	}
	defer rows.Close()
	out := []WALSlotStats{}
	for rows.Next() {
		var w WALSlotStats
		if err := rows.Scan(&w.Slot, &w.Active, &w.WALStatus, &w.LagBytes, &w.SafeWALSizeBytes); err != nil {
			return nil, fmt.Errorf("admin: stats: replication slots: %w", err)
		}
		out = append(out, w)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("admin: stats: replication slots: %w", err)
	}
	return out, nil
}
