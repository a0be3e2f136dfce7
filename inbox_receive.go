package pgrelay

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/pgrelay/pgrelay/internal/db"
	"github.com/pgrelay/pgrelay/internal/event"
)

// target is one handler Receive stores rows for: an event is stored, and
// later processed, once per target, deduplicated by the key its strategy
// builds.
type target struct {
	// Handler is the handler's name (ValidateHandlerName). Default
	// DefaultHandlerName.
	Handler string
	// Strategy builds the dedup key. Default: the message-id strategy.
	Strategy keyStrategy
	// ByTopic overrides Strategy for the messages of the named topics.
	ByTopic map[string]keyStrategy
}

// strategyFor returns the strategy that keys m for this target.
func (t target) strategyFor(m Message) keyStrategy {
	if s, ok := t.ByTopic[m.Topic]; ok {
		return s
	}
	return t.Strategy
}

// defaultTargets is what Receive stores for: the default handler, keyed by
// event id.
var defaultTargets = []target{{Handler: DefaultHandlerName}}

// validateTargets checks handler names and that no handler is named twice.
func validateTargets(targets []target) error {
	seen := make(map[string]bool, len(targets))
	for _, t := range targets {
		name := t.Handler
		if name == "" {
			name = DefaultHandlerName
		}
		if err := ValidateHandlerName(name); err != nil {
			return err
		}
		if seen[name] {
			return fmt.Errorf("handler %q is named twice", name)
		}
		seen[name] = true
	}
	return nil
}

// storedProcessed names the handler whose live rows the insert stores
// directly as processed (InboxWorker.ReceiveApply), by which worker and since
// when. The zero value stores every live row pending.
type storedProcessed struct {
	handler, workerID string
	started           time.Time
}

// receive is ReceiveWith, storing the live rows of sp.handler processed;
// it also returns the rows the insert stored.
func receive(ctx context.Context, q db.DBTX, msgs []Incoming, opts receiveOptions, sp storedProcessed) (ReceiveResult, []db.InsertInboxRow, error) {
	targets := opts.targets
	var res ReceiveResult
	if len(msgs) == 0 {
		return res, nil, nil
	}
	if len(targets) == 0 {
		targets = defaultTargets
	}
	if err := validateTargets(targets); err != nil {
		return res, nil, fmt.Errorf("inbox: receive: %w", err)
	}
	b := newReceiveBatch(msgs, targets, opts)
	if err := b.plan(time.Now()); err != nil {
		return ReceiveResult{}, nil, err
	}
	b.p.ApplyHandler, b.p.WorkerID, b.p.StartedAt = sp.handler, sp.workerID, sp.started
	inserted, err := b.insert(ctx, q)
	if err != nil {
		return ReceiveResult{}, nil, err
	}
	if len(inserted) < len(b.p.Handlers) {
		// Only the rows not inserted are compared with what is stored: one
		// more set-based statement, for batches holding duplicates only.
		if err := b.absorbStored(ctx, q, inserted); err != nil {
			return ReceiveResult{}, nil, err
		}
	}
	if err := b.record(ctx, q); err != nil {
		return ReceiveResult{}, nil, err
	}
	b.listDuplicates()
	return b.res, inserted, nil
}

// storedRow names an inbox row: its handler and dedup key.
type storedRow struct{ Handler, DedupKey string }

// receiveOptions is ReceiveOptions with the targets' key strategies parsed.
type receiveOptions struct {
	targets           []target
	noDuplicateRecord bool
}

// rowKey is an inbox row's identity: its handler and dedup key.
type rowKey struct{ handler, key string }

// rowRef names the message and target a planned row was built from.
type rowRef struct {
	msg    int
	target int
}

// receiveBatch is the state of one ReceiveWith call, from planning the rows
// to the result: the insert's parameters, which message first carried each
// row key, what was absorbed, and the conflicts and key sequences to record.
type receiveBatch struct {
	msgs    []Incoming
	targets []target
	p       db.InsertInboxParams
	first   map[rowKey]int // row key → message index of its first copy
	rows    map[rowKey]rowRef
	// absorbedFor counts the targets that absorbed each message.
	absorbedFor []int
	fps         [][]byte
	conflicts   []conflictRow
	seqs        absorbedSeqs
	res         ReceiveResult
}

// newReceiveBatch sizes the insert's parameters for one row per message and
// target; nothing is planned yet.
func newReceiveBatch(msgs []Incoming, targets []target, opts receiveOptions) *receiveBatch {
	n := len(msgs) * len(targets)
	return &receiveBatch{
		msgs:    msgs,
		targets: targets,
		p: db.InsertInboxParams{
			Handlers:      make([]string, 0, n),
			DedupKeys:     make([]string, 0, n),
			Fingerprints:  make([][]byte, 0, n),
			KeyStrategies: make([]string, 0, n),
			EventIds:      make([]string, 0, n),
			Topics:        make([]string, 0, n),
			Keys:          make([]string, 0, n),
			EventTypes:    make([]string, 0, n),
			Payloads:      make([][]byte, 0, n),
			Headers:       make([]json.RawMessage, 0, n),
			OccurredAts:   make([]time.Time, 0, n),
			DeadReasons:   make([]string, 0, n),
			// Recorded by the insert statement itself: no extra round trip.
			RepeatedHandlers:  []string{},
			RepeatedDedupKeys: []string{},
			RepeatedEventIds:  []string{},
			RecordDuplicates:  !opts.noDuplicateRecord,
		},
		first:       make(map[rowKey]int, n),
		rows:        make(map[rowKey]rowRef, n),
		absorbedFor: make([]int, len(msgs)),
		fps:         make([][]byte, len(msgs)),
	}
}

// fingerprint returns message i's payload fingerprint, computed once.
func (b *receiveBatch) fingerprint(i int) []byte {
	if b.fps[i] == nil {
		b.fps[i] = payloadFingerprint(b.msgs[i].Payload)
	}
	return b.fps[i]
}

// plan validates every message and plans its row for each target, in message
// then target order, without touching the database. A row key repeated in the
// batch becomes an absorbed delivery of the first message that carried it;
// every other row goes into the insert's parameters. The first invalid
// message fails the batch with an *InvalidMessageError. now stands in for a
// missing occurred-at.
func (b *receiveBatch) plan(now time.Time) error {
	for i, m := range b.msgs {
		headers, occurred, payload, err := storedFields(m, now)
		if err != nil {
			return &InvalidMessageError{Index: i, EventID: m.EventID, Err: err}
		}
		for ti, t := range b.targets {
			handler := t.Handler
			if handler == "" {
				handler = DefaultHandlerName
			}
			strat := t.strategyFor(m.Message)
			key, deadReason := b.dedupKey(handler, strat, m)
			rk := rowKey{handler, key}
			if j, dup := b.first[rk]; dup {
				b.absorbRepeat(i, j, handler, key, strat)
				continue
			}
			b.first[rk] = i
			b.rows[rk] = rowRef{msg: i, target: ti}
			b.p.Handlers = append(b.p.Handlers, handler)
			b.p.DedupKeys = append(b.p.DedupKeys, key)
			b.p.Fingerprints = append(b.p.Fingerprints, b.fingerprint(i))
			b.p.KeyStrategies = append(b.p.KeyStrategies, strat.String())
			b.p.EventIds = append(b.p.EventIds, m.EventID)
			b.p.Topics = append(b.p.Topics, m.Topic)
			b.p.Keys = append(b.p.Keys, m.Key)
			b.p.EventTypes = append(b.p.EventTypes, m.EventType)
			b.p.Payloads = append(b.p.Payloads, payload)
			b.p.Headers = append(b.p.Headers, headers)
			b.p.OccurredAts = append(b.p.OccurredAts, occurred)
			b.p.DeadReasons = append(b.p.DeadReasons, deadReason)
			b.p.KeySeqs = append(b.p.KeySeqs, m.KeySeq)
		}
	}
	return nil
}

// storedFields validates m and returns what its rows store whatever the
// target: its headers as JSON ("{}" when none), its occurred-at (now when
// unset) and its payload (never nil). An error means m cannot be stored.
func storedFields(m Incoming, now time.Time) (json.RawMessage, time.Time, []byte, error) {
	if err := validateIncoming(m); err != nil {
		return nil, time.Time{}, nil, err
	}
	headers := json.RawMessage("{}")
	// The trace context and the expiry, which the outbox keeps in columns of
	// its own, are kept with the headers and lifted back when the event is
	// claimed (docs/tracing.md, docs/delayed.md).
	stored := m.inboxHeaders()
	if len(stored) > 0 {
		b, err := json.Marshal(stored)
		if err != nil {
			return nil, time.Time{}, nil, err
		}
		headers = b
	}
	occurred := m.OccurredAt
	if occurred.IsZero() {
		occurred = now
	}
	payload := m.Payload
	if payload == nil {
		payload = []byte{}
	}
	return headers, occurred, payload, nil
}

// dedupKey returns the key m is stored under for handler with strat, and the
// reason its row is stored dead (empty for a live row): the event id for the
// message-id strategy; otherwise the strategy's key, or, for a message
// already dead or whose key cannot be built (recorded in the result's
// KeyFailures), the reserved key '!'+event id.
func (b *receiveBatch) dedupKey(handler string, strat keyStrategy, m Incoming) (key, deadReason string) {
	deadReason = m.DeadReason
	key = m.EventID
	if !strat.IsMessageID() {
		if deadReason == "" {
			k, err := strat.Key(m.Message)
			if err != nil {
				deadReason = err.Error()
				b.res.KeyFailures = append(b.res.KeyFailures, KeyFailure{Handler: handler, EventID: m.EventID, Reason: deadReason})
			} else {
				key = k
			}
		}
		if deadReason != "" {
			// Never keyed by something else: dead under a key no
			// strategy builds.
			key = "!" + m.EventID
		}
	}
	return key, deadReason
}

// absorbRepeat records message i's row (handler, key) as absorbed by message
// j, which carried the same row key earlier in the batch: a conflict when
// their fingerprints differ, a key sequence to record when i's differs from
// j's, and a duplicate for the insert statement to record.
func (b *receiveBatch) absorbRepeat(i, j int, handler, key string, strat keyStrategy) {
	m := b.msgs[i]
	b.absorbedFor[i]++
	a := Absorbed{Handler: handler, DedupKey: key, EventID: m.EventID, StoredEventID: b.msgs[j].EventID}
	if !bytes.Equal(b.fingerprint(i), b.fingerprint(j)) {
		a.Conflict = true
		b.conflicts = append(b.conflicts, conflictRow{a: a, strategy: strat.String(), msg: i, storedFP: b.fingerprint(j)})
	}
	b.res.Absorbed = append(b.res.Absorbed, a)
	if m.KeySeq > 0 && (b.msgs[j].Key != m.Key || b.msgs[j].KeySeq != m.KeySeq) {
		b.seqs.add(handler, m.Key, m.KeySeq, key, b.msgs[j].Key == m.Key)
	}
	b.p.RepeatedHandlers = append(b.p.RepeatedHandlers, handler)
	b.p.RepeatedDedupKeys = append(b.p.RepeatedDedupKeys, key)
	b.p.RepeatedEventIds = append(b.p.RepeatedEventIds, m.EventID)
}

// insert stores the planned rows in one statement, in (handler, dedup key)
// order, and sets the result's Inserted and Stored. It returns the rows
// inserted: the others' keys were already stored.
func (b *receiveBatch) insert(ctx context.Context, q db.DBTX) ([]db.InsertInboxRow, error) {
	sortRows(&b.p)
	inserted, err := db.New().InsertInbox(ctx, q, b.p)
	if err != nil {
		return nil, fmt.Errorf("inbox: receive %d messages: %w", len(b.msgs), err)
	}
	b.res.Inserted = len(inserted)
	b.res.stored = make([]storedRow, len(inserted))
	for i, r := range inserted {
		b.res.stored[i] = storedRow{Handler: r.Handler, DedupKey: r.DedupKey}
	}
	return inserted, nil
}

// absorbStored reports each planned row the insert did not store as absorbed
// by the stored row holding its key, read in one more statement: a conflict
// when the stored fingerprint differs, a key sequence to record when the
// stored row is of another sequence.
func (b *receiveBatch) absorbStored(ctx context.Context, q db.DBTX, inserted []db.InsertInboxRow) error {
	absent := b.notInserted(inserted)
	got, err := db.New().InboxStoredKeys(ctx, q, absent)
	if err != nil {
		return fmt.Errorf("inbox: receive: read stored keys: %w", err)
	}
	found := make(map[rowKey]db.InboxStoredKeysRow, len(got))
	for _, g := range got {
		found[rowKey{g.Handler, g.DedupKey}] = g
	}
	for i := range absent.Handlers {
		rk := rowKey{absent.Handlers[i], absent.DedupKeys[i]}
		g, ok := found[rk]
		b.absorbByStored(rk, g, ok)
	}
	return nil
}

// notInserted returns the keys of the planned rows missing from inserted, in
// the insert's order.
func (b *receiveBatch) notInserted(inserted []db.InsertInboxRow) db.InboxStoredKeysParams {
	stored := make(map[rowKey]bool, len(inserted))
	for _, r := range inserted {
		stored[rowKey{r.Handler, r.DedupKey}] = true
	}
	var absent db.InboxStoredKeysParams
	for i := range b.p.Handlers {
		if rk := (rowKey{b.p.Handlers[i], b.p.DedupKeys[i]}); !stored[rk] {
			absent.Handlers = append(absent.Handlers, rk.handler)
			absent.DedupKeys = append(absent.DedupKeys, rk.key)
		}
	}
	return absent
}

// absorbByStored records the planned row rk as absorbed by the stored row g
// (ok false: no stored row was found).
func (b *receiveBatch) absorbByStored(rk rowKey, g db.InboxStoredKeysRow, ok bool) {
	ref := b.rows[rk]
	a := Absorbed{Handler: rk.handler, DedupKey: rk.key, EventID: b.msgs[ref.msg].EventID}
	if m := b.msgs[ref.msg]; m.KeySeq > 0 && (!ok || g.Key != m.Key || g.KeySeq == nil || *g.KeySeq != m.KeySeq) {
		// Another sequence than the stored row's own (a redelivery
		// carries the same).
		b.seqs.add(rk.handler, m.Key, m.KeySeq, rk.key, !ok || g.Key == m.Key)
	}
	if ok {
		// A row deleted again meanwhile (retention, purge) is
		// absorbed all the same, with nothing to compare.
		a.StoredEventID = g.EventID
		if !bytes.Equal(g.Fingerprint, b.fingerprint(ref.msg)) {
			a.Conflict = true
			b.conflicts = append(b.conflicts, conflictRow{a: a, strategy: b.targets[ref.target].strategyFor(b.msgs[ref.msg].Message).String(),
				msg: ref.msg, storedFP: g.Fingerprint})
		}
	}
	b.res.Absorbed = append(b.res.Absorbed, a)
	b.absorbedFor[ref.msg]++
}

// record writes, in q, the conflicts found (one statement, only when there
// are some) and then the absorbed key sequences (only when there are some),
// setting the result's SeqsWoken.
func (b *receiveBatch) record(ctx context.Context, q db.DBTX) error {
	if len(b.conflicts) > 0 {
		if err := recordConflicts(ctx, q, b.conflicts, b.msgs, b.fingerprint); err != nil {
			return err
		}
	}
	if len(b.seqs) > 0 {
		// Rare: only deliveries absorbed by a row of another sequence.
		var err error
		if b.res.SeqsWoken, err = b.seqs.record(ctx, q); err != nil {
			return fmt.Errorf("inbox: receive: record %d absorbed key sequences: %w", len(b.seqs), err)
		}
	}
	return nil
}

// listDuplicates sets the result's Duplicates: the event ids of the messages
// every target absorbed, in batch order.
func (b *receiveBatch) listDuplicates() {
	for i, m := range b.msgs {
		if b.absorbedFor[i] == len(b.targets) {
			b.res.Duplicates = append(b.res.Duplicates, m.EventID)
		}
	}
}

// absorbedSeqs collects the key sequences of deliveries absorbed by a stored
// row of another sequence (a content-hash or business key matched another
// event): they count as delivered for ordered apply, or a key's next
// sequence would wait for them for ever.
type absorbedSeqs []absorbedSeq

type absorbedSeq struct {
	handler, key string
	seq          int64
	// dedupKey names the absorbing row; sameKey says it may be of key.
	dedupKey string
	sameKey  bool
}

func (a *absorbedSeqs) add(handler, key string, seq int64, dedupKey string, sameKey bool) {
	*a = append(*a, absorbedSeq{handler: handler, key: key, seq: seq, dedupKey: dedupKey, sameKey: sameKey})
}

// txBeginner starts a transaction: a pool or a connection.
type txBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// record writes the absorbed sequences in q (Receive's transaction): it locks
// their keys' state rows in one order, moves an absorbing row of the same key
// to an earlier absorbed sequence (MoveInboxKeySeq: its effect belongs at the
// first sequence that carried it, and its own sequence counts as absorbed
// instead), then records the sequences (AbsorbInboxKeySeqs). It returns how
// many waiting events that made due.
func (a absorbedSeqs) record(ctx context.Context, q db.DBTX) (int64, error) {
	if _, isTx := q.(pgx.Tx); !isTx {
		if b, ok := q.(txBeginner); ok {
			// Called with a pool: the key states stay locked from the check
			// to the write.
			var n int64
			err := pgx.BeginFunc(ctx, b, func(tx pgx.Tx) error {
				var err error
				n, err = a.record(ctx, tx)
				return err
			})
			return n, err
		}
	}
	slices.SortFunc(a, func(x, y absorbedSeq) int {
		return cmp.Or(strings.Compare(x.handler, y.handler), strings.Compare(x.key, y.key), cmp.Compare(x.seq, y.seq))
	})
	qs := db.New()
	var lock db.LockInboxKeyStatesParams
	for i, s := range a {
		if i == 0 || s.handler != a[i-1].handler || s.key != a[i-1].key {
			lock.Handlers = append(lock.Handlers, s.handler)
			lock.Keys = append(lock.Keys, s.key)
		}
	}
	if err := qs.LockInboxKeyStates(ctx, q, lock); err != nil {
		return 0, err
	}
	var p db.AbsorbInboxKeySeqsParams
	for _, s := range a {
		seq := s.seq
		if s.sameKey {
			var err error
			if seq, err = qs.MoveInboxKeySeq(ctx, q, db.MoveInboxKeySeqParams{
				Seq: s.seq, Handler: s.handler, DedupKey: s.dedupKey, Key: s.key,
			}); err != nil {
				return 0, err
			}
		}
		p.Handlers = append(p.Handlers, s.handler)
		p.Keys = append(p.Keys, s.key)
		p.Seqs = append(p.Seqs, seq)
	}
	return qs.AbsorbInboxKeySeqs(ctx, q, p)
}

type conflictRow struct {
	a        Absorbed
	strategy string
	msg      int
	storedFP []byte
}

// recordConflicts writes the batch's conflicts in one statement.
func recordConflicts(ctx context.Context, q db.DBTX, cs []conflictRow, msgs []Incoming, fingerprint func(int) []byte) error {
	p := db.InsertInboxConflictsParams{}
	for _, c := range cs {
		m := msgs[c.msg]
		payload := m.Payload
		if payload == nil {
			payload = []byte{}
		}
		p.Handlers = append(p.Handlers, c.a.Handler)
		p.DedupKeys = append(p.DedupKeys, c.a.DedupKey)
		p.KeyStrategies = append(p.KeyStrategies, c.strategy)
		p.StoredEventIds = append(p.StoredEventIds, c.a.StoredEventID)
		p.EventIds = append(p.EventIds, c.a.EventID)
		p.StoredFingerprints = append(p.StoredFingerprints, c.storedFP)
		p.Fingerprints = append(p.Fingerprints, fingerprint(c.msg))
		p.Topics = append(p.Topics, m.Topic)
		p.EventTypes = append(p.EventTypes, m.EventType)
		p.Payloads = append(p.Payloads, payload)
	}
	if err := db.New().InsertInboxConflicts(ctx, q, p); err != nil {
		return fmt.Errorf("inbox: receive: record %d key conflicts: %w", len(cs), err)
	}
	return nil
}

// sortRows orders the rows of p by (handler, dedup key): the insert then
// takes its unique-index locks in one global order, so that two consumers
// storing overlapping batches at the same time wait for each other instead of
// deadlocking.
func sortRows(p *db.InsertInboxParams) {
	idx := make([]int, len(p.EventIds))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int {
		if c := strings.Compare(p.Handlers[a], p.Handlers[b]); c != 0 {
			return c
		}
		return strings.Compare(p.DedupKeys[a], p.DedupKeys[b])
	})
	if slices.IsSorted(idx) {
		return
	}
	p.Handlers = permute(p.Handlers, idx)
	p.DedupKeys = permute(p.DedupKeys, idx)
	p.Fingerprints = permute(p.Fingerprints, idx)
	p.KeyStrategies = permute(p.KeyStrategies, idx)
	p.EventIds = permute(p.EventIds, idx)
	p.Topics = permute(p.Topics, idx)
	p.Keys = permute(p.Keys, idx)
	p.EventTypes = permute(p.EventTypes, idx)
	p.Payloads = permute(p.Payloads, idx)
	p.Headers = permute(p.Headers, idx)
	p.OccurredAts = permute(p.OccurredAts, idx)
	p.DeadReasons = permute(p.DeadReasons, idx)
	p.KeySeqs = permute(p.KeySeqs, idx)
}

func permute[T any](s []T, idx []int) []T {
	out := make([]T, len(idx))
	for i, j := range idx {
		out[i] = s[j]
	}
	return out
}

func validateIncoming(m Incoming) error {
	if err := event.ValidateEventID(m.EventID); err != nil {
		return err
	}
	switch {
	case m.KeySeq < 0:
		return fmt.Errorf("key sequence %d: must be positive (0: none)", m.KeySeq)
	case m.KeySeq > 0 && m.Key == "":
		return fmt.Errorf("key sequence %d without a key", m.KeySeq)
	}
	if err := event.ValidateKey(m.Key); err != nil {
		return err
	}
	fields := []struct{ name, v string }{
		{"topic", m.Topic}, {"key", m.Key}, {"event_type", m.EventType}, {"dead reason", m.DeadReason},
		{"content type", m.ContentType},
	}
	for k, v := range m.Headers {
		fields = append(fields, struct{ name, v string }{"header name", k}, struct{ name, v string }{"header " + k, v})
	}
	for _, f := range fields {
		if err := validText(f.v); err != nil {
			return fmt.Errorf("%s: %w", f.name, err)
		}
	}
	return nil
}

// validText rejects what PostgreSQL text and jsonb cannot hold.
func validText(s string) error {
	switch {
	case !utf8.ValidString(s):
		return errors.New("not valid UTF-8")
	case strings.IndexByte(s, 0) >= 0:
		return errors.New("contains a NUL byte")
	}
	return nil
}
