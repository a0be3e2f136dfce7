package admin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgrelay/pgrelay/internal/db"
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

// WALGapRequest accepts the gap of a WAL capture slot (docs/wal.md#failover).
type WALGapRequest struct {
	Slot   string `json:"slot"`
	Actor  string `json:"actor"`
	Reason string `json:"reason"`
}

// WALGap is an accepted gap: the events committed after FromLSN (the slot's
// last confirmed position, recorded at ConfirmedAt) and before ToLSN (the
// new slot's start) were read from no slot.
type WALGap struct {
	ID          int64     `json:"id"`
	Slot        string    `json:"slot"`
	FromLSN     string    `json:"from_lsn"`
	ToLSN       string    `json:"to_lsn"`
	ConfirmedAt time.Time `json:"confirmed_at"`
	Cause       string    `json:"cause"`
}

// AcceptWALGap records who accepted the slot's open gap, and why: the WAL
// capture relay then streams the new slot. ErrInvalid when the slot has no
// open gap.
func (s *Service) AcceptWALGap(ctx context.Context, r WALGapRequest) (WALGap, error) {
	if err := validateActor(r.Actor, r.Reason, true); err != nil {
		return WALGap{}, err
	}
	if r.Slot == "" {
		return WALGap{}, fmt.Errorf("%w: slot is required", ErrInvalid)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	row, err := s.q.AcceptWALGap(ctx, s.cfg.Pool, db.AcceptWALGapParams{Slot: r.Slot, Actor: r.Actor, Reason: r.Reason})
	if errors.Is(err, pgx.ErrNoRows) {
		return WALGap{}, fmt.Errorf("%w: slot %q has no gap waiting to be accepted", ErrInvalid, r.Slot)
	}
	if err != nil {
		return WALGap{}, fmt.Errorf("admin: accept the WAL gap: %w", err)
	}
	s.cfg.Logger.Info("WAL capture gap accepted", slog.String("slot", r.Slot), slog.String("from_lsn", row.FromLsn),
		slog.String("to_lsn", row.ToLsn), slog.String("actor", r.Actor), slog.String("reason", r.Reason))
	return WALGap{ID: row.ID, Slot: r.Slot, FromLSN: row.FromLsn, ToLSN: row.ToLsn, ConfirmedAt: row.ConfirmedAt, Cause: row.Cause}, nil
}
