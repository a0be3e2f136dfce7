package pgrelay

import (
	"context"

	"github.com/jackc/pgx/v5"
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
// refuses NotBefore and Delay (the WAL relay cannot hold an event back);
// ExpiresAt is honoured. A table relay (the default) never sees emitted
// events.
func Emit(ctx context.Context, tx pgx.Tx, msgs ...Message) error {
	return defaultOutbox.Emit(ctx, tx, toEvents(msgs)...)
}

// Emit writes msgs to the WAL inside tx with o's configuration; see the
// function Emit.
func (o *Outbox) Emit(ctx context.Context, tx pgx.Tx, msgs ...Message) error {
	return o.o.Emit(ctx, tx, toEvents(msgs)...)
}
