package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/walmsg"
)

// The WAL capture also reads the inserts into pgrelay.outbox_wal, the
// trigger-less outbox table of this mode (migration 00108): the table is in
// the relay's publication (publish = 'insert'), pgoutput sends each committed
// insert's new row, and the relay turns it into the same event an emitted
// message becomes, in the same commit-ordered stream. The rows are only the
// vehicle: once committed the event is in the WAL, so the streaming relay
// empties the table with TRUNCATE, which the publication does not publish.
//
// One invariant makes TRUNCATE safe: while the table is in the publication,
// every committed row of it is in the slot's stream after the slot's
// confirmed position, or was acknowledged by the broker already. Rows
// inserted before the table joined the publication (or before the slot was
// created) are not in the stream, so the relay adds the table in one
// transaction that also re-inserts the rows it holds (adopt), under a lock
// that waits for the producers' open inserts; and before it creates a slot
// it takes the table out of the publication, so that the next adoption
// covers what the new slot missed. TRUNCATE commits only if the table is
// still in the publication under the TRUNCATE's lock.

const (
	walTableSchema = "pgrelay"
	walTableName   = "outbox_wal"
	walTable       = walTableSchema + "." + walTableName
)

// walTableExists reports whether migration 00108's table exists.
func (w *walSource) walTableExists(ctx context.Context) (bool, error) {
	var ok bool
	err := w.r.cfg.Pool.QueryRow(ctx, `SELECT pg_catalog.to_regclass('`+walTable+`') IS NOT NULL`).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("look for %s: %w", walTable, err)
	}
	return ok, nil
}

// walTableMember reports whether pgrelay.outbox_wal is in the publication.
func walTableMember(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, publication string) (bool, error) {
	var ok bool
	err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = $3)`,
		publication, walTableSchema, walTableName).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("read publication %s: %w", publication, err)
	}
	return ok, nil
}

// leavePublication takes the table out of the publication, before the relay
// creates a slot: the rows committed before the slot are not in it, and the
// adoption that adds the table back re-inserts them.
func (w *walSource) leavePublication(ctx context.Context) error {
	pub := w.r.cfg.walPublication
	if ok, err := walTableMember(ctx, w.r.cfg.Pool, pub); err != nil || !ok {
		return err
	}
	_, err := w.r.cfg.Pool.Exec(ctx, "ALTER PUBLICATION "+pgx.Identifier{pub}.Sanitize()+" DROP TABLE "+walTable)
	if err != nil && !isCode(err, "42704") { // not a member
		return fmt.Errorf("take %s out of publication %s: %w", walTable, pub, err)
	}
	return nil
}

// maintainTable keeps pgrelay.outbox_wal in the publication (adopting the
// rows the stream may lack) and, when truncate is set, empties it. It waits
// at most WAL.LockTimeout for the table's lock; it reports whether it
// truncated.
func (w *walSource) maintainTable(ctx context.Context, truncate bool) (truncated bool, err error) {
	cfg := w.r.cfg
	pub := cfg.walPublication
	err = pgx.BeginFunc(ctx, cfg.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_catalog.set_config('lock_timeout', $1, true)`, fmt.Sprintf("%dms", cfg.walLockTimeout.Milliseconds())); err != nil {
			return err
		}
		member, err := walTableMember(ctx, tx, pub)
		if err != nil {
			return err
		}
		if !member {
			return w.adopt(ctx, tx)
		}
		if !truncate {
			return nil
		}
		var nonEmpty bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+walTable+`)`).Scan(&nonEmpty); err != nil || !nonEmpty {
			return err
		}
		if h := cfg.hooks.walBeforeTruncate; h != nil {
			h()
		}
		if _, err := tx.Exec(ctx, `TRUNCATE `+walTable); err != nil {
			return fmt.Errorf("truncate %s: %w", walTable, err)
		}
		// The check above held nothing: the table may have left the
		// publication since, and a row committed meanwhile is not in the
		// stream. Taking it out (ALTER PUBLICATION ... DROP TABLE) locks the
		// table, which the TRUNCATE now holds exclusively: this check sees
		// the membership that stays until the commit.
		if member, err := walTableMember(ctx, tx, pub); err != nil || !member {
			return cmp.Or(err, errLeftPublication)
		}
		truncated = true
		return nil
	})
	if errors.Is(err, errLeftPublication) {
		w.log.Debug(walTable+" left the publication before its TRUNCATE; kept for the next adoption", slog.String("publication", pub))
		return false, nil
	}
	return truncated, err
}

// errLeftPublication rolls back a TRUNCATE of the table that found it no
// longer in the publication.
var errLeftPublication = errors.New(walTable + " left the publication")

// adopt adds the table to the publication and re-inserts, in the same
// transaction, the rows it holds: committed before the table was in the
// publication, they are not in the stream; re-inserted after the ALTER,
// they are decoded with it (a row the stream had already is published
// twice, deduplicated by its event id). The SHARE lock waits for the
// producers' open inserts, which would otherwise commit invisible to the
// copy and decoded under the old publication.
func (w *walSource) adopt(ctx context.Context, tx pgx.Tx) error {
	pub := pgx.Identifier{w.r.cfg.walPublication}.Sanitize()
	if _, err := tx.Exec(ctx, `LOCK TABLE `+walTable+` IN SHARE MODE`); err != nil {
		return fmt.Errorf("lock %s: %w", walTable, err)
	}
	if _, err := tx.Exec(ctx, `ALTER PUBLICATION `+pub+` ADD TABLE `+walTable); err != nil {
		return fmt.Errorf("add %s to publication %s: %w", walTable, w.r.cfg.walPublication, err)
	}
	if _, err := tx.Exec(ctx, `ALTER PUBLICATION `+pub+` SET (publish = 'insert')`); err != nil {
		return fmt.Errorf("publication %s: %w", w.r.cfg.walPublication, err)
	}
	tag, err := tx.Exec(ctx, `WITH d AS (DELETE FROM `+walTable+` RETURNING *) INSERT INTO `+walTable+` SELECT * FROM d`)
	if err != nil {
		return fmt.Errorf("re-insert the rows of %s: %w", walTable, err)
	}
	w.log.Info("added "+walTable+" to the publication", slog.String("publication", w.r.cfg.walPublication),
		slog.Int64("rows_reinserted", tag.RowsAffected()))
	return nil
}

// setupTable runs at set-up, once the slot exists: it adds the table to the
// publication when it is not there. A role that may not (not the table's
// owner) is reported, not fatal: emitted events do not need the table.
func (w *walSource) setupTable(ctx context.Context) error {
	ok, err := w.walTableExists(ctx)
	if err != nil || !ok {
		return err
	}
	if _, err := w.maintainTable(ctx, false); err != nil {
		if isCode(err, "42501") {
			w.log.Error("cannot add "+walTable+" to the publication: rows inserted there are not published; "+
				"give the relay's role ownership of the table (docs/wal.md)", slog.Any("error", err))
			return nil
		}
		return err
	}
	return nil
}

// truncateLoop empties the table every WAL.TruncateInterval while this relay
// streams the slot (standbys leave it to the reader).
func (w *walSource) truncateLoop(ctx context.Context) {
	every := w.r.cfg.WALTruncateInterval
	if every < 0 {
		return
	}
	t := time.NewTimer(wait0(every))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		t.Reset(every)
		w.mu.Lock()
		reading := w.cur != nil
		w.mu.Unlock()
		if !reading {
			continue
		}
		qctx, cancel := context.WithTimeout(ctx, w.r.cfg.QueryTimeout)
		exists, err := w.walTableExists(qctx)
		if err == nil && exists {
			var done bool
			done, err = w.maintainTable(qctx, true)
			if done {
				w.log.Debug("emptied " + walTable)
			}
		}
		cancel()
		switch {
		case err == nil || ctx.Err() != nil:
		case isCode(err, "55P03"): // lock_not_available: producers hold it; next time
			w.log.Debug("emptying "+walTable+" gave way to the producers; retrying later", slog.Any("error", err))
		default:
			w.log.Warn("empty "+walTable, slog.Any("error", err))
		}
	}
}

// wait0 is the first wait of truncateLoop: a short one, so that a table
// filled while no relay ran is emptied soon after a relay starts.
func wait0(every time.Duration) time.Duration {
	return min(every, 5*time.Second)
}

// isWALTable reports whether rel is pgrelay.outbox_wal.
func isWALTable(rel *pglogrepl.RelationMessage) bool {
	return rel.Namespace == walTableSchema && rel.RelationName == walTableName
}

// decodeWALRow turns an insert's new row of pgrelay.outbox_wal into its
// event. Columns are found by name (one the relay does not know is
// ignored); their values come in the binary format (the replication
// option binary 'true') or, for a type without one, in text.
func decodeWALRow(tm *pgtype.Map, rel *pglogrepl.RelationMessage, tuple *pglogrepl.TupleData) (pgrelay.Message, error) {
	if tuple == nil {
		return pgrelay.Message{}, errors.New("insert without a row")
	}
	var r walmsg.Row
	for i, col := range tuple.Columns {
		if i >= len(rel.Columns) {
			break
		}
		rc := rel.Columns[i]
		var dst any
		switch rc.Name {
		case "event_id":
			dst = &r.EventID
		case "topic":
			dst = &r.Topic
		case "key":
			dst = &r.Key
		case "event_type":
			dst = &r.EventType
		case "payload":
			dst = &r.Payload
		case "headers":
			dst = &r.Headers // the JSON text
		case "occurred_at":
			dst = &r.OccurredAt
		case "expires_at":
			dst = &r.ExpiresAt
		case "traceparent":
			dst = &r.TraceParent
		case "tracestate":
			dst = &r.TraceState
		default:
			continue
		}
		var format int16
		switch col.DataType {
		case pglogrepl.TupleDataTypeNull:
			continue
		case pglogrepl.TupleDataTypeBinary:
			format = pgtype.BinaryFormatCode
		case pglogrepl.TupleDataTypeText:
			format = pgtype.TextFormatCode
		default:
			return pgrelay.Message{}, fmt.Errorf("column %s: unexpected tuple data type %q", rc.Name, col.DataType)
		}
		if err := tm.Scan(rc.DataType, format, col.Data, dst); err != nil {
			return pgrelay.Message{}, fmt.Errorf("column %s: %w", rc.Name, err)
		}
	}
	we, err := walmsg.FromRow(r)
	m := walMessage(we)
	if err != nil {
		return m, err
	}
	return m, checkWALEvent(m)
}

// walMessage is the message an event read from the WAL publishes.
func walMessage(e walmsg.Event) pgrelay.Message {
	return pgrelay.Message{EventID: e.EventID, Topic: e.Topic, Key: e.Key, EventType: e.EventType,
		ContentType: e.ContentType, Headers: e.Headers, OccurredAt: e.OccurredAt, Payload: e.Payload,
		ExpiresAt: e.ExpiresAt, TraceParent: e.TraceParent, TraceState: e.TraceState}
}

// checkWALEvent applies to an event read from the WAL (a row of
// pgrelay.outbox_wal, which has no CHECK, or an emitted message) the rules
// Enqueue applies that decoding does not: the topic rule, the key's length,
// occurred-at's range.
func checkWALEvent(m pgrelay.Message) error {
	if !event.ValidTopic(m.Topic) {
		return fmt.Errorf("event %s: topic %q is invalid: letters, digits, '-', '_' and '.' between non-empty parts, at most 255 bytes", m.EventID, m.Topic)
	}
	if err := event.ValidateKey(m.Key); err != nil {
		return fmt.Errorf("event %s: %w", m.EventID, err)
	}
	if _, err := event.NormalizeOccurredAt(m.OccurredAt); err != nil {
		return fmt.Errorf("event %s: %w", m.EventID, err)
	}
	return nil
}
