package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/db"
)

// Per-key sequences of the WAL capture (docs/wal.md#per-key-sequences). The
// table capture's sequences come from the outbox's insert trigger; the WAL
// has no row to number, so the reader numbers each keyed event itself, in
// commit order, right before publishing it: one statement per publish batch
// (AssignWALKeySeqs) records event id → (key, sequence) in
// pgrelay.wal_seq_assignments and raises the key's counter in
// pgrelay.outbox_key_seqs. An event read again (after a crash, a takeover, a
// PostgreSQL restart) finds its recorded number and is published with it
// again. Only the slot's streaming connection may number (the statement
// checks that the slot's active_pid is this session's walsender), so a
// relay the server cut off cannot number, from its stale read, events whose
// numbers were pruned already. The numbering works on the relay's event
// struct (pgrelay.Message), whichever source decoded it.

// errNotHolder: the numbering statement found that this session's
// connection no longer streams the slot (or raced one that did).
var errNotHolder = errors.New("numbering key sequences refused: this session no longer streams the slot; dropped without publishing")

// takesKeySeq reports whether m gets a per-key sequence: it has an explicit
// key, not its own event id (the default key), as in the table capture.
func takesKeySeq(m *pgrelay.Message) bool { return m.Key != "" && m.Key != m.EventID }

// numberKeySeqs sets KeySeq on the keyed events of msgs, ends[i] being the
// end of msgs[i]'s transaction in the WAL. An error wrapping errNotHolder
// ends the session; another error is transient (retry the batch).
func (s *walSession) numberKeySeqs(ctx context.Context, msgs []pgrelay.Message, ends []pglogrepl.LSN) error {
	r := s.w.r
	var ids, keys []string
	var lsns []int64
	distinct := map[string]bool{}
	for i := range msgs {
		msgs[i].KeySeq = 0 // the relay's number, never a producer's
		if !takesKeySeq(&msgs[i]) {
			continue
		}
		ids = append(ids, msgs[i].EventID)
		keys = append(keys, msgs[i].Key)
		lsns = append(lsns, int64(ends[i]))
		distinct[msgs[i].EventID] = true
	}
	if len(ids) == 0 {
		return nil
	}
	if h := r.cfg.hooks.walBeforeNumber; h != nil {
		h()
	}
	qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	rows, err := r.q.AssignWALKeySeqs(qctx, r.cfg.Pool, db.AssignWALKeySeqsParams{
		SlotName: r.cfg.WALSlot, Pid: int32(s.conn.PID()), EventIds: ids, Keys: keys, Lsns: lsns,
	})
	cancel()
	if err != nil {
		return fmt.Errorf("number key sequences: %w", err)
	}
	if len(rows) < len(distinct) {
		// No rows: this connection no longer holds the slot. Fewer: another
		// reader numbered some of them meanwhile. Either way the session
		// ends and the next one reads again from the confirmed position.
		return fmt.Errorf("%w (%d of %d events numbered)", errNotHolder, len(rows), len(distinct))
	}
	type idKey struct{ id, key string }
	seqs := make(map[idKey]int64, len(rows))
	for _, row := range rows {
		seqs[idKey{row.EventID, row.Key}] = row.Seq
	}
	for i := range msgs {
		if !takesKeySeq(&msgs[i]) {
			continue
		}
		seq, ok := seqs[idKey{msgs[i].EventID, msgs[i].Key}]
		if !ok {
			// The same event id emitted again with another key: numbered
			// with the key it was first read with; this copy goes without.
			s.w.log.Warn("an event id read again with another key is published without a key sequence",
				slog.String("event_id", msgs[i].EventID), slog.String("key", msgs[i].Key))
			continue
		}
		msgs[i].KeySeq = seq
	}
	return nil
}

// dropExpired removes from msgs (and ends, alongside) the events whose
// ExpiresAt is at or before now on the relay's clock: they are not
// published. Each is logged and counted (Observer.Expired, as the table
// relay counts the rows it marks dead as expired).
func (s *walSession) dropExpired(msgs []pgrelay.Message, ends []pglogrepl.LSN) ([]pgrelay.Message, []pglogrepl.LSN) {
	now := time.Now()
	kept := 0
	for i := range msgs {
		m := &msgs[i]
		if !m.ExpiresAt.IsZero() && !now.Before(m.ExpiresAt) {
			s.w.log.Warn("event expired before it was published; dropped", slog.String("event_id", m.EventID),
				slog.String("topic", m.Topic), slog.Time("expires_at", m.ExpiresAt), slog.Any("commit_end", ends[i]))
			continue
		}
		msgs[kept], ends[kept] = msgs[i], ends[i]
		kept++
	}
	if n := len(msgs) - kept; n > 0 {
		s.w.r.cfg.obs.Expired(walPartition, n)
	}
	return msgs[:kept], ends[:kept]
}

// pruneKeySeqs deletes the recorded numbers the slot can no longer hand out
// again (their transaction ended before the slot's restart_lsn).
func (w *walSource) pruneKeySeqs(ctx context.Context) {
	n, err := w.r.q.PruneWALKeySeqs(ctx, w.r.cfg.Pool, w.r.cfg.WALSlot)
	if err != nil {
		if ctx.Err() == nil {
			w.log.Warn("prune the WAL capture's key sequence records", slog.Any("error", err))
		}
		return
	}
	if n > 0 {
		w.log.Debug("pruned key sequence records", slog.Int64("rows", n))
	}
}
