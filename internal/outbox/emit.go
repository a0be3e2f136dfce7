package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/walmsg"
)

// Emit writes msgs to the write-ahead log inside tx, for a relay capturing
// from the WAL (docs/wal.md): each one a transactional logical decoding
// message with the prefix "pgrelay" (pg_logical_emit_message), decoded only
// if tx commits. No table is touched. It validates and completes the messages
// as Enqueue does (EventID a new UUIDv7, Key the EventID, OccurredAt now),
// every message before writing any. A message with NotBefore or Delay is
// refused (ErrInvalidSchedule): the WAL cannot hold an event back. ExpiresAt
// travels with the event: the relay does not publish it after that time, nor
// the consumer apply it. Emit does not deduplicate event ids (the broker's
// duplicate window and the inbox do) and writes no per-key sequence: the
// relay numbers keyed events as it publishes them.
func (o *Outbox) Emit(ctx context.Context, tx pgx.Tx, msgs ...event.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	msgs = event.WithCauseFromContext(ctx, msgs)
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
		b, err := walmsg.Encode(m)
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
