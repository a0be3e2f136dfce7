package admin

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgrelay/pgrelay/internal/db"
)

func (s *Service) listOutboxDead(ctx context.Context, q db.DBTX, f Filter) ([]DeadLetter, error) {
	rows, err := s.q.AdminListOutboxDead(ctx, q, db.AdminListOutboxDeadParams{
		EventID: narg(f.EventID), Topic: narg(f.Topic), EventType: narg(f.EventType), Key: narg(f.Key),
		ErrorContains: narg(f.ErrorContains), DeadAfter: f.DeadAfter, DeadBefore: f.DeadBefore,
		MaxRows: s.limit(f),
	})
	if err != nil {
		return nil, err
	}
	out := make([]DeadLetter, 0, len(rows))
	for _, r := range rows {
		out = append(out, DeadLetter{
			Source: SourceOutbox, ID: r.ID, EventID: r.EventID, Status: "dead", Topic: r.Topic, Key: r.Key,
			EventType: r.EventType, Attempts: r.Attempts, CreatedAt: &r.CreatedAt,
			DeadAt: &r.DeadAt, LastError: deref(r.LastError), Partition: r.Partition,
		})
	}
	return out, nil
}

func (s *Service) showOutbox(ctx context.Context, eventID string) (*DeadLetter, error) {
	r, err := s.q.AdminGetOutboxEvent(ctx, s.cfg.Pool, eventID)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: outbox event %q", ErrNotFound, eventID)
	}
	if err != nil {
		return nil, fmt.Errorf("admin: show outbox event %q: %w", eventID, err)
	}
	d := &DeadLetter{
		Source: SourceOutbox, ID: r.ID, EventID: r.EventID, Status: r.Status, Topic: r.Topic, Key: r.Key,
		EventType: r.EventType, Attempts: r.Attempts, CreatedAt: &r.CreatedAt, LastError: deref(r.LastError),
		OccurredAt: &r.OccurredAt, Partition: r.Partition,
	}
	switch r.Status {
	case "dead":
		d.DeadAt = r.DeadAt
		if d.DeadAt == nil {
			d.DeadAt = &r.CreatedAt
		}
	case "published":
		d.DeadAt = r.PublishedAt
	}
	d.Payload, d.PayloadEncoding = encodePayload(r.Payload)
	d.Headers = decodeHeaders(r.Headers)
	return d, nil
}
