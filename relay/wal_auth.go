package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pglogrepl"

	"github.com/pgrelay/pgrelay/internal/walmsg"
)

// Who can publish through the WAL capture (docs/wal.md#who-can-publish):
// any role may write a message with pgrelay's prefix
// (pg_logical_emit_message is executable by PUBLIC), so the relay publishes
// only those signed with a key of pgrelay.wal_keys, which only the functions
// pgrelay.emit and pgrelay.emit_wal (SECURITY DEFINER, EXECUTE granted by the
// operator) read. Any other is skipped, logged, counted
// (relay_wal_rejected_total) and confirmed past like the rest of its
// transaction, so the slot does not stall.

// errRejected: a message skipped because no allowed producer signed it.
var errRejected = errors.New("rejected")

// loadKeys reads pgrelay.wal_keys.
func (w *walSource) loadKeys(ctx context.Context) (map[int32][]byte, error) {
	qctx, cancel := context.WithTimeout(ctx, w.r.cfg.QueryTimeout)
	defer cancel()
	rows, err := w.r.q.WALKeys(qctx, w.r.cfg.Pool)
	if err != nil {
		return nil, fmt.Errorf("read the WAL signing keys (pgrelay.wal_keys; the relay's role needs SELECT on it, docs/wal.md#who-can-publish): %w", err)
	}
	keys := make(map[int32][]byte, len(rows))
	for _, k := range rows {
		keys[k.ID] = k.Secret
	}
	return keys, nil
}

// verify returns the event lm carries when an allowed producer signed it.
// A key id it does not know makes it read the keys again (one added since
// the session began) before it rejects. A rejected message is logged and
// counted, and errRejected returned; another error ends the session.
func (s *walSession) verify(ctx context.Context, lm *pglogrepl.LogicalDecodingMessage) ([]byte, error) {
	body, kid, err := walmsg.Verify(lm.Content, s.keys)
	if errors.Is(err, walmsg.ErrUnknownKey) {
		keys, lerr := s.w.loadKeys(ctx)
		if lerr != nil {
			return nil, lerr
		}
		s.keys = keys
		body, kid, err = walmsg.Verify(lm.Content, s.keys)
	}
	if err == nil {
		return body, nil
	}
	fields := []any{slog.String("reason", err.Error()), slog.String("lsn", lm.LSN.String())}
	hint := "it was written with pg_logical_emit_message, which any role may call, or by a producer of a release before migration 00116: " +
		"producers write with pgrelay.Emit or pgrelay.emit, their role granted EXECUTE (docs/wal.md#who-can-publish)"
	if errors.Is(err, walmsg.ErrUnsigned) {
		// What it claims to be, to find its writer.
		if m, derr := walmsg.Decode(lm.Content); derr == nil {
			fields = append(fields, slog.String("event_id", m.EventID), slog.String("topic", m.Topic), slog.String("event_type", m.EventType))
		}
	} else {
		fields = append(fields, slog.Any("key_id", kid))
		hint = "its signature does not match a key of pgrelay.wal_keys: forged, altered, or signed with a key deleted before the relay read it"
	}
	s.w.log.Error("a pgrelay message in the WAL is not signed by an allowed producer: skipped, never published; "+hint, fields...)
	if o := s.w.r.cfg.walObs; o != nil {
		o.WALRejected(err.Error())
	}
	return nil, errRejected
}
