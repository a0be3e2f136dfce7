package pgrelay

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/walmsg"
)

// Emit writes msgs to PostgreSQL's write-ahead log inside tx, for a relay
// that captures from the WAL (relay.Config.Capture "wal", docs/wal.md): they
// are published if and only if tx commits, and no table is touched. Each
// message is a transactional logical decoding message with the prefix
// "pgrelay" (pg_logical_emit_message); plain SQL writes the same with
// pgrelay.emit(...). Messages are validated and completed as Enqueue does
// them (EventID a new UUIDv7, Key the EventID, OccurredAt now), every one
// before any is written. Events sharing a Key are published in commit order.
//
// Unlike Enqueue, Emit does not refuse an event id used before: the broker's
// duplicate window and the inbox deduplicate. Per-key sequences
// (Message.KeySeq) are assigned by the relay as it publishes, in commit
// order, and kept across re-reads (docs/wal.md#per-key-sequences). Emit
// refuses NotBefore and Delay (ErrInvalidSchedule: the WAL relay cannot hold
// an event back); ExpiresAt is honoured. A table relay (the default) never
// sees emitted events.
func Emit(ctx context.Context, tx pgx.Tx, msgs ...Message) error {
	return defaultOutbox.Emit(ctx, tx, msgs...)
}

// Emit writes msgs to the WAL inside tx with o's configuration; see the
// function Emit.
func (o *Outbox) Emit(ctx context.Context, tx pgx.Tx, msgs ...Message) error {
	if len(msgs) == 0 {
		return nil
	}
	msgs = causeFromContext(ctx, msgs)
	contents := make([][]byte, len(msgs))
	now := time.Now().Round(time.Microsecond)
	for i, m := range msgs {
		if err := o.validate(m); err != nil {
			return fmt.Errorf("outbox: message %d: %w", i, err)
		}
		if !m.NotBefore.IsZero() || m.Delay != 0 {
			// The WAL is read in commit order and published as it is read:
			// nothing could hold an event back (docs/delayed.md).
			return fmt.Errorf("outbox: message %d: %w: WAL capture cannot delay an event (NotBefore, Delay); write it with Enqueue", i, ErrInvalidSchedule)
		}
		if !m.ExpiresAt.IsZero() {
			m.ExpiresAt = m.ExpiresAt.Round(time.Microsecond).UTC()
		}
		if m.EventID == "" {
			u, err := uuid.NewV7()
			if err != nil {
				return fmt.Errorf("outbox: message %d: generate event id: %w", i, err)
			}
			m.EventID = u.String()
		}
		if m.Key == "" {
			m.Key = m.EventID
		}
		if m.OccurredAt.IsZero() {
			m.OccurredAt = now
		} else {
			m.OccurredAt, _ = event.NormalizeOccurredAt(m.OccurredAt) // validated above
		}
		m.KeySeq = 0
		b, err := walmsg.Encode(walmsg.Event{EventID: m.EventID, Topic: m.Topic, Key: m.Key, EventType: m.EventType,
			ContentType: m.ContentType, Headers: m.Headers, OccurredAt: m.OccurredAt, Payload: m.Payload,
			ExpiresAt: m.ExpiresAt, TraceParent: m.TraceParent, TraceState: m.TraceState})
		if err != nil {
			return fmt.Errorf("outbox: message %d: encode: %w", i, err)
		}
		contents[i] = b
	}
	if err := o.q.EmitWAL(ctx, tx, contents); err != nil {
		return fmt.Errorf("outbox: emit %d messages to the WAL: %w", len(msgs), err)
	}
	return nil
}
