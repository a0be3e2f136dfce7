package pgrelay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/internal/db"
	"github.com/pgrelay/pgrelay/internal/wait"
)

// Ordered apply (InboxConfig.Ordered). The events of one key carry contiguous
// sequences (Message.KeySeq, assigned by the outbox). For each
// (handler, key) the table inbox_key_state holds last_applied, the highest
// sequence applied, updated in the transaction that applies the event. Three
// layers keep a key in order:
//
//   - The claim (ClaimInboxOrdered) hands out an event with a sequence only
//     when key_seq <= last_applied + 1: never a key's later event while an
//     earlier one is unapplied (missing, pending, retrying, in flight, dead).
//   - The gate (gate), in the batch transaction, locks the batch's key state
//     rows and runs each key's events in sequence: an event at or below
//     last_applied is absorbed as a duplicate without running the handler,
//     one above the next expected sequence is handed back (out of order: a
//     race between two claims); after a failure of one of a key's events,
//     its later events in the batch are handed back.
//   - Events that cannot run yet wait as pending with next_attempt_at
//     'infinity' (HoldInboxOrdered, from the periodic scan), so that claims
//     stop walking past them; applying sequence n makes n+1 due in the same
//     transaction (AdvanceInboxKeyState), and the scan repairs any wake a race
//     lost (WakeInboxOrdered).
//
// A dead event parks its key: last_applied stops below it, so the key's later
// events wait, until the event is requeued (it runs again, in order) or
// skipped (SkipDead). A sequence that never arrives is a gap: after
// InboxConfig.GapTimeout it is reported, and an operator may skip it (SkipGap).

// SeqOutcome is what ordered apply (InboxConfig.Ordered) did with an event
// (or, for SeqGapReported, with a key), counted by a SequenceObserver.
type SeqOutcome string

// The sequence outcomes.
const (
	// SeqApplied: the event ran and committed, in its key's order.
	SeqApplied SeqOutcome = "applied_in_order"
	// SeqDuplicate: the event's sequence was already applied for its key;
	// absorbed without running the handler.
	SeqDuplicate SeqOutcome = "duplicate_seq"
	// SeqOutOfOrder: the event was claimed while an earlier sequence of its
	// key was unapplied (two claims raced); handed back without running.
	SeqOutOfOrder SeqOutcome = "out_of_order"
	// SeqHeld: the periodic scan made an event wait for an earlier sequence
	// (or updated the sequence a waiting event's note names).
	SeqHeld SeqOutcome = "held"
	// SeqGapReported: a key waited longer than InboxConfig.GapTimeout for a
	// sequence that never arrived.
	SeqGapReported SeqOutcome = "gap_reported"
	// SeqGapSkipped: an operator skipped a gap (SkipGap).
	SeqGapSkipped SeqOutcome = "gap_skipped"
	// SeqDeadSkipped: an operator skipped a dead event of an ordered key
	// (SkipDead).
	SeqDeadSkipped SeqOutcome = "dead_skipped"
	// SeqParked: an event with a sequence went dead; its key waits.
	SeqParked SeqOutcome = "parked"
	// SeqFenced: the event was taken over by another worker before its
	// apply committed; this worker's effect was rolled back.
	SeqFenced SeqOutcome = "fenced"
	// SeqUnsequenced: an event without a sequence, applied unordered.
	SeqUnsequenced SeqOutcome = "unsequenced"
)

// SequenceObserver is an optional extension of InboxObserver: an observer that
// implements it is told the sequence outcomes of ordered apply.
type SequenceObserver interface {
	Sequence(o SeqOutcome, n int)
}

// sequenceError says why ordered mode did not apply an event: its key, its
// sequence and the one the key expected.
type sequenceError struct {
	Outcome       SeqOutcome
	Key           string
	Seq, Expected int64
}

func (e *sequenceError) Error() string {
	return fmt.Sprintf("%s: key %q sequence %d, expected %d", e.Outcome, e.Key, e.Seq, e.Expected)
}

// sequence reports n events of outcome o to the observer, when it listens.
func (w *InboxWorker) sequence(o SeqOutcome, n int) {
	if so, ok := w.cfg.Observer.(SequenceObserver); ok && n > 0 {
		so.Sequence(o, n)
	}
}

// orderRun puts each key's sequenced events of a claim in sequence order,
// keeping the slots the key's events had (so the batch stays first come,
// first served across keys).
func orderRun(evs []*InboxEvent) {
	slots := map[string][]int{}
	for i, ev := range evs {
		if ev.KeySeq > 0 {
			slots[ev.Key] = append(slots[ev.Key], i)
		}
	}
	for _, idx := range slots {
		if len(idx) < 2 {
			continue
		}
		group := make([]*InboxEvent, len(idx))
		for j, i := range idx {
			group[j] = evs[i]
		}
		slices.SortStableFunc(group, func(a, b *InboxEvent) int {
			switch {
			case a.KeySeq < b.KeySeq:
				return -1
			case a.KeySeq > b.KeySeq:
				return 1
			}
			return 0
		})
		for j, i := range idx {
			evs[i] = group[j]
		}
	}
}

// gated is what the gate made of a batch.
type gated struct {
	run      []*InboxEvent    // events to run, each key's in sequence
	absorbed []result         // duplicates, closed in tx
	held     []*InboxEvent    // out of order: handed back at once
	last     map[string]int64 // each key's last applied sequence before the batch
}

// gate locks the key state of evs' sequenced keys in tx and sorts evs into the
// events to run, the duplicates (closed in tx at once) and the out-of-order
// ones (to hand back).
func (w *InboxWorker) gate(ctx context.Context, tx pgx.Tx, evs []*InboxEvent) (gated, error) {
	var keys []string
	for _, ev := range evs {
		if ev.KeySeq > 0 {
			keys = append(keys, ev.Key)
		}
	}
	g := gated{last: map[string]int64{}}
	if len(keys) == 0 {
		g.run = evs
		return g, nil
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	rows, err := w.q.LockInboxKeyState(ctx, tx, db.LockInboxKeyStateParams{Handler: w.cfg.HandlerName, Keys: keys})
	if err != nil {
		return g, fmt.Errorf("inbox: lock key state: %w", err)
	}
	for _, r := range rows {
		g.last[r.Key] = r.LastApplied
	}
	next := make(map[string]int64, len(rows))
	for k, v := range g.last {
		next[k] = v + 1
	}
	var dups, again []*InboxEvent
	for _, ev := range evs {
		if ev.KeySeq == 0 {
			g.run = append(g.run, ev)
			continue
		}
		exp := next[ev.Key]
		switch {
		case ev.KeySeq <= g.last[ev.Key]:
			dups = append(dups, ev)
		case ev.KeySeq < exp:
			// Another event of this batch carries the same sequence and runs
			// first. This one is not absorbed before that effect commits:
			// handed back, it is absorbed once the first committed, or
			// applies in its place when the first fails or goes dead.
			w.log.Info("inbox: another event with the same key sequence runs in this batch; handed back until it commits",
				slog.String("event_id", ev.EventID), slog.String("key", ev.Key), slog.Int64("key_seq", ev.KeySeq))
			again = append(again, ev)
		case ev.KeySeq == exp:
			g.run = append(g.run, ev)
			next[ev.Key] = exp + 1
		default:
			w.log.Warn("inbox: ordered event claimed before an earlier sequence of its key; handed back",
				slog.String("event_id", ev.EventID),
				slog.Any("error", &sequenceError{Outcome: SeqOutOfOrder, Key: ev.Key, Seq: ev.KeySeq, Expected: exp}))
			g.held = append(g.held, ev)
			next[ev.Key] = -1 // nothing later of this key runs in this batch
		}
	}
	w.handBackHeld(ctx, g.held, true)
	w.handBackHeld(ctx, again, false)
	g.held = append(g.held, again...)
	if len(dups) > 0 {
		p := db.AbsorbInboxSeqDuplicatesParams{Handler: w.cfg.HandlerName}
		for _, ev := range dups {
			p.DedupKeys = append(p.DedupKeys, ev.DedupKey)
			p.LockVersions = append(p.LockVersions, ev.LockVersion)
			p.LastApplied = append(p.LastApplied, g.last[ev.Key])
		}
		marked, err := w.q.AbsorbInboxSeqDuplicates(ctx, tx, p)
		if err != nil {
			return g, fmt.Errorf("inbox: absorb duplicate sequences: %w", err)
		}
		ok := make(map[string]bool, len(marked))
		for _, k := range marked {
			ok[k] = true
		}
		for _, ev := range dups {
			g.absorbed = append(g.absorbed, result{ev: ev, absorbed: ok[ev.DedupKey], fenced: !ok[ev.DedupKey]})
		}
	}
	return g, nil
}

// handBackHeld hands the out-of-order events of a batch (counted as such when
// outOfOrder), or those repeating a sequence the batch runs, back at once,
// outside the batch transaction (they never ran), each only once per claim.
func (w *InboxWorker) handBackHeld(ctx context.Context, held []*InboxEvent, outOfOrder bool) {
	var todo []*InboxEvent
	for _, ev := range held {
		if !ev.heldBack {
			ev.heldBack = true
			todo = append(todo, ev)
		}
	}
	if len(todo) == 0 {
		return
	}
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.QueryTimeout)
	defer cancel()
	w.unclaim(uctx, todo)
	if outOfOrder {
		w.sequence(SeqOutOfOrder, len(todo))
	}
}

// advance records, in tx, the sequences of applied that ran, and reports how
// many waiting events that made due.
func (w *InboxWorker) advance(ctx context.Context, tx pgx.Tx, applied []*InboxEvent) (int64, error) {
	top := map[string]int64{}
	for _, ev := range applied {
		if ev.KeySeq > top[ev.Key] {
			top[ev.Key] = ev.KeySeq
		}
	}
	if len(top) == 0 {
		return 0, nil
	}
	p := db.AdvanceInboxKeyStateParams{Handler: w.cfg.HandlerName}
	for k, s := range top {
		p.Keys = append(p.Keys, k)
		p.Seqs = append(p.Seqs, s)
	}
	n, err := w.q.AdvanceInboxKeyState(ctx, tx, p)
	if err != nil {
		return 0, fmt.Errorf("inbox: advance key state: %w", err)
	}
	return n, nil
}

// scanOrdered runs, about every PollInterval, the housekeeping of ordered
// mode: it makes due the waiting events whose turn has come (a wake a race
// lost), makes wait the due events whose turn has not, notes gaps and reports
// those open longer than InboxConfig.GapTimeout.
func (w *InboxWorker) scanOrdered(ctx context.Context) {
	// Skips are counted from the audit trail, whoever made them; those made
	// before this worker started are not counted again.
	skipsSeen := int64(-1)
	for {
		if skipsSeen < 0 {
			qctx, cancel := context.WithTimeout(ctx, w.cfg.QueryTimeout)
			if id, err := w.q.LastAuditID(qctx, w.cfg.Pool); err == nil {
				skipsSeen = id
			}
			cancel()
		} else {
			skipsSeen = w.countSkips(ctx, skipsSeen)
		}
		if err := w.scanOrderedOnce(ctx); err != nil && ctx.Err() == nil {
			w.log.Warn("inbox: ordered scan", slog.Any("error", err))
		}
		t := time.NewTimer(wait.Jitter(w.cfg.PollInterval, jitterSpread))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// countSkips reports the skips audited after audit id seen and returns the
// new highest id.
func (w *InboxWorker) countSkips(ctx context.Context, seen int64) int64 {
	qctx, cancel := context.WithTimeout(ctx, w.cfg.QueryTimeout)
	defer cancel()
	rows, err := w.q.OrderedSkipsSince(qctx, w.cfg.Pool, db.OrderedSkipsSinceParams{Handler: w.cfg.HandlerName, After: seen})
	if err != nil {
		return seen
	}
	for _, r := range rows {
		switch r.Action {
		case "skip_gap":
			w.sequence(SeqGapSkipped, int(r.N))
		case "skip_dead":
			w.sequence(SeqDeadSkipped, int(r.N))
		}
		seen = max(seen, r.LastID)
	}
	return seen
}

func (w *InboxWorker) scanOrderedOnce(ctx context.Context) error {
	qctx, cancel := context.WithTimeout(ctx, w.cfg.QueryTimeout)
	defer cancel()
	h := w.cfg.HandlerName
	woken, err := w.q.WakeInboxOrdered(qctx, w.cfg.Pool, h)
	if err != nil {
		return fmt.Errorf("wake: %w", err)
	}
	if woken > 0 {
		w.log.Info("inbox: waiting ordered events made due by the scan", slog.Int64("events", woken))
		w.wake.broadcast()
	}
	held, err := w.q.HoldInboxOrdered(qctx, w.cfg.Pool, h)
	if err != nil {
		return fmt.Errorf("hold: %w", err)
	}
	w.sequence(SeqHeld, int(held))
	if err := w.q.RecordInboxGaps(qctx, w.cfg.Pool, h); err != nil {
		return fmt.Errorf("record gaps: %w", err)
	}
	gaps, err := w.q.ReportInboxGaps(qctx, w.cfg.Pool, db.ReportInboxGapsParams{Handler: h, Timeout: interval(w.cfg.GapTimeout)})
	if err != nil {
		return fmt.Errorf("report gaps: %w", err)
	}
	for _, g := range gaps {
		w.log.Warn("inbox: ordered key waits for a missing sequence; later events are held until it arrives or is skipped (consumer gaps skip)",
			slog.String("key", g.Key), slog.Int64("last_applied", g.LastApplied), slog.Int64("missing_seq", g.MissingSeq),
			slog.Time("since", g.GapSince))
	}
	w.sequence(SeqGapReported, len(gaps))
	return nil
}

// WaitingKey is a key of an ordered handler whose events wait (ListWaiting).
type WaitingKey struct {
	Handler string `json:"handler"`
	Key     string `json:"key"`
	// LastApplied is the highest sequence applied; WaitingFor the next one.
	LastApplied int64 `json:"last_applied"`
	WaitingFor  int64 `json:"waiting_for_seq"`
	// State is "gap" (WaitingFor never arrived), "parked" (it is dead) or
	// "behind" (it is pending, retrying or in flight).
	State string `json:"state"`
	// Held is how many later events wait; FirstHeld the lowest of them.
	Held      int64     `json:"held"`
	FirstHeld int64     `json:"first_held_seq,omitempty"`
	Oldest    time.Time `json:"oldest"`
	// GapSince is when the gap was first seen (nil unless State is "gap"
	// and a scan saw it); Reported when it was reported.
	GapSince *time.Time `json:"gap_since,omitempty"`
	Reported *time.Time `json:"gap_reported_at,omitempty"`
}

// ListWaiting returns up to limit keys of ordered handlers whose events wait
// (of handler, or of every handler when it is empty): why (gap, parked,
// behind), the sequence they wait for and how many events are held.
func ListWaiting(ctx context.Context, q DBTX, handler string, limit int) ([]WaitingKey, error) {
	rows, err := db.New().ListInboxOrderedKeys(ctx, q, db.ListInboxOrderedKeysParams{Handler: handler, MaxRows: int32(limit)})
	if err != nil {
		return nil, fmt.Errorf("inbox: list waiting keys: %w", err)
	}
	out := make([]WaitingKey, len(rows))
	for i, r := range rows {
		state := "gap"
		switch r.NextStatus {
		case "dead":
			state = "parked"
		case "pending", "processing":
			state = "behind"
		}
		out[i] = WaitingKey{Handler: r.Handler, Key: r.Key, LastApplied: r.LastApplied, WaitingFor: r.WaitingForSeq,
			State: state, Held: r.Held, FirstHeld: r.FirstHeld, Oldest: r.OldestHeld, GapSince: r.GapSince,
			Reported: r.GapReportedAt}
		if state != "gap" {
			out[i].GapSince, out[i].Reported = nil, nil
		}
	}
	return out, nil
}

// Errors of SkipGap and SkipDead.
var (
	ErrNoGap     = errors.New("no gap to skip")
	ErrNotParked = errors.New("not a dead event parking an ordered key")
)

// Skip is an operator's skip: who, why.
type Skip struct {
	Handler, Actor, Reason string
}

// SkipResult says what a skip did.
type SkipResult struct {
	Key string `json:"key"`
	// From and To are the sequences skipped (a gap: every missing one up to
	// the first held event; a dead event: its own).
	From int64 `json:"from_seq"`
	To   int64 `json:"to_seq"`
	// Woken counts the waiting events made due.
	Woken int64 `json:"woken"`
}

func (s Skip) check() error {
	switch {
	case s.Handler == "":
		return errors.New("inbox: skip: handler is required")
	case strings.TrimSpace(s.Actor) == "":
		return errors.New("inbox: skip: actor is required")
	}
	return ValidateHandlerName(s.Handler)
}

// SkipGap gives up on the missing sequences of key: the key's last applied
// sequence moves to just below its first held event, which becomes due. It
// refuses (ErrNoGap) when the next sequence is present (pending, in flight or
// dead: see SkipDead) or nothing is held. A skipped event that arrives later
// is absorbed as a duplicate. The skip is audited (replay_audit, action
// skip_gap, event_id "<key>#<from>-<to>").
func SkipGap(ctx context.Context, pool *pgxpool.Pool, s Skip, key string) (SkipResult, error) {
	if err := s.check(); err != nil {
		return SkipResult{}, err
	}
	var res SkipResult
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		q := db.New()
		last, err := q.LockInboxKeyStateRow(ctx, tx, db.LockInboxKeyStateRowParams{Handler: s.Handler, Key: key})
		if err != nil {
			return fmt.Errorf("inbox: skip gap: lock key state: %w", err)
		}
		present, err := q.InboxSeqStatus(ctx, tx, db.InboxSeqStatusParams{Handler: s.Handler, Key: key, Seq: last + 1})
		if err != nil {
			return fmt.Errorf("inbox: skip gap: %w", err)
		}
		if len(present) > 0 {
			return fmt.Errorf("%w: key %q sequence %d is in the inbox (event %s, %s)", ErrNoGap, key, last+1,
				present[0].EventID, present[0].Status)
		}
		first, err := q.FirstHeldInboxSeq(ctx, tx, db.FirstHeldInboxSeqParams{Handler: s.Handler, Key: key, Above: last})
		if err != nil {
			return fmt.Errorf("inbox: skip gap: %w", err)
		}
		if first == 0 {
			return fmt.Errorf("%w: key %q holds no event after sequence %d", ErrNoGap, key, last)
		}
		res = SkipResult{Key: key, From: last + 1, To: first - 1}
		if res.Woken, err = q.AdvanceInboxKeyState(ctx, tx, db.AdvanceInboxKeyStateParams{
			Handler: s.Handler, Keys: []string{key}, Seqs: []int64{first - 1},
		}); err != nil {
			return fmt.Errorf("inbox: skip gap: %w", err)
		}
		if err := q.NotifyInbox(ctx, tx); err != nil {
			return fmt.Errorf("inbox: skip gap: notify: %w", err)
		}
		return q.InsertOrderedSkipAudit(ctx, tx, db.InsertOrderedSkipAuditParams{
			Action: "skip_gap", EventID: fmt.Sprintf("%s#%d-%d", key, res.From, res.To), Actor: s.Actor,
			Reason: s.Reason, Handler: s.Handler,
		})
	})
	return res, err
}

// SkipDead gives up on a dead event that parks its ordered key: the key's
// last applied sequence moves past it and its next event becomes due. The
// event stays dead (it can still be requeued, which then applies it as a
// duplicate: absorbed). It refuses (ErrNotParked) for an event that is not
// dead, has no sequence, or is not the key's next sequence. Audited
// (replay_audit, action skip_dead).
func SkipDead(ctx context.Context, pool *pgxpool.Pool, s Skip, eventID string) (SkipResult, error) {
	if err := s.check(); err != nil {
		return SkipResult{}, err
	}
	var res SkipResult
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		q := db.New()
		row, err := q.InboxDeadOrdered(ctx, tx, db.InboxDeadOrderedParams{Handler: s.Handler, EventID: eventID})
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: no dead event %q for handler %q", ErrNotParked, eventID, s.Handler)
		}
		if err != nil {
			return fmt.Errorf("inbox: skip dead: %w", err)
		}
		if row.KeySeq == nil {
			return fmt.Errorf("%w: event %q has no key sequence (dead requeue or purge it instead)", ErrNotParked, eventID)
		}
		last, err := q.LockInboxKeyStateRow(ctx, tx, db.LockInboxKeyStateRowParams{Handler: s.Handler, Key: row.Key})
		if err != nil {
			return fmt.Errorf("inbox: skip dead: lock key state: %w", err)
		}
		if *row.KeySeq != last+1 {
			return fmt.Errorf("%w: event %q is sequence %d of key %q, which has applied up to %d", ErrNotParked,
				eventID, *row.KeySeq, row.Key, last)
		}
		res = SkipResult{Key: row.Key, From: *row.KeySeq, To: *row.KeySeq}
		if res.Woken, err = q.AdvanceInboxKeyState(ctx, tx, db.AdvanceInboxKeyStateParams{
			Handler: s.Handler, Keys: []string{row.Key}, Seqs: []int64{*row.KeySeq},
		}); err != nil {
			return fmt.Errorf("inbox: skip dead: %w", err)
		}
		if err := q.NotifyInbox(ctx, tx); err != nil {
			return fmt.Errorf("inbox: skip dead: notify: %w", err)
		}
		return q.InsertOrderedSkipAudit(ctx, tx, db.InsertOrderedSkipAuditParams{
			Action: "skip_dead", EventID: eventID, Actor: s.Actor, Reason: s.Reason,
			PreviousAttempts: row.Attempts, PreviousError: row.LastError, Handler: s.Handler,
		})
	})
	return res, err
}

// reportSequence counts the sequence outcome of a committed result.
func (w *InboxWorker) reportSequence(r result) {
	ev := r.ev
	switch {
	case ev.KeySeq == 0:
		if r.processed {
			w.sequence(SeqUnsequenced, 1)
		}
	case r.absorbed:
		w.log.Info("inbox: duplicate key sequence absorbed without running the handler",
			slog.String("event_id", ev.EventID), slog.String("key", ev.Key), slog.Int64("key_seq", ev.KeySeq))
		w.sequence(SeqDuplicate, 1)
	case r.fenced:
		w.sequence(SeqFenced, 1)
	case r.processed:
		w.sequence(SeqApplied, 1)
	case r.d.outcome == outcomeDead:
		w.log.Warn("inbox: ordered key parked behind a dead event; its later events wait until it is requeued or skipped",
			slog.String("event_id", ev.EventID), slog.String("key", ev.Key), slog.Int64("key_seq", ev.KeySeq))
		w.sequence(SeqParked, 1)
	}
}
