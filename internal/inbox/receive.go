package inbox

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

// Incoming is a message to store. DeadReason, when non-empty, stores it
// directly as dead (status='dead', last_error=DeadReason, finished_at=now()):
// malformed input, raw bytes kept in Payload.
type Incoming struct {
	event.Message
	DeadReason string
}

// Target is one handler Receive stores rows for: an event is stored, and
// later processed, once per target, deduplicated by the key its strategy
// builds.
type Target struct {
	// Handler is the handler's name (ValidateHandlerName). Default
	// DefaultHandlerName.
	Handler string
	// Strategy builds the dedup key. Default: the message-id strategy.
	Strategy KeyStrategy
	// ByTopic overrides Strategy for the messages of the named topics.
	ByTopic map[string]KeyStrategy
}

// strategyFor returns the strategy that keys m for this target.
func (t Target) strategyFor(m event.Message) KeyStrategy {
	if s, ok := t.ByTopic[m.Topic]; ok {
		return s
	}
	return t.Strategy
}

// DefaultTargets is what Receive stores for: the default handler, keyed by
// event id.
var DefaultTargets = []Target{{Handler: DefaultHandlerName}}

// ValidateTargets checks handler names and that no handler is named twice.
func ValidateTargets(targets []Target) error {
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

// ReceiveResult reports what Receive stored.
type ReceiveResult struct {
	// Inserted counts the rows stored (one per message and target).
	Inserted int
	// Duplicates lists the event ids of the messages stored for no target
	// because every target's key was already in the inbox or repeated
	// earlier in the same batch (once per repetition), conflicts included.
	Duplicates []string
	// Absorbed lists, per target, every message not stored because its key
	// was already stored (or repeated earlier in the batch).
	Absorbed []Absorbed
	// KeyFailures lists the rows stored dead because their target's
	// strategy could not build a key.
	KeyFailures []KeyFailure
	// Stored lists the rows this call inserted (dead ones included), by
	// handler and dedup key; Worker.ApplyStored takes them.
	Stored []StoredRow
	// SeqsWoken counts the ordered events made due because a delivery
	// absorbed by a row of another key sequence filled the sequence they
	// waited for (the caller wakes the workers).
	SeqsWoken int64
}

// StoredRow names an inbox row: its handler and dedup key.
type StoredRow struct{ Handler, DedupKey string }

// Absorbed is a delivery the inbox did not store for a handler because the
// handler's dedup key was already stored.
type Absorbed struct {
	Handler, DedupKey, EventID string
	// StoredEventID is the event id of the stored row holding the key.
	StoredEventID string
	// Conflict is set when the stored row's payload fingerprint differs from
	// this delivery's: same key, different content. It is recorded in
	// inbox_conflicts; the stored event's effect stands.
	Conflict bool
}

// KeyFailure is a row stored dead because its key could not be built.
type KeyFailure struct {
	Handler, EventID, Reason string
}

// Conflicts returns the absorbed deliveries that were conflicts.
func (r ReceiveResult) Conflicts() []Absorbed {
	var out []Absorbed
	for _, a := range r.Absorbed {
		if a.Conflict {
			out = append(out, a)
		}
	}
	return out
}

// ReceiveOptions tunes ReceiveWith. The zero value is Receive's behaviour.
type ReceiveOptions struct {
	// Targets are the handlers rows are stored for. Default DefaultTargets.
	Targets []Target
	// NoDuplicateRecord skips recording duplicates in inbox_duplicates and
	// counting the batch in inbox_receive_counts (the console's dedup feed
	// and hit rate). Default false: both are written by the insert statement
	// itself, with the handler each duplicate was absorbed for.
	NoDuplicateRecord bool
}

// Receive stores a batch of messages for the default handler, keyed by event
// id: ReceiveFor(ctx, q, DefaultTargets, msgs).
func Receive(ctx context.Context, q db.DBTX, msgs []Incoming) (ReceiveResult, error) {
	return ReceiveWith(ctx, q, msgs, ReceiveOptions{})
}

// ReceiveFor is ReceiveWith with the given targets and the duplicate record
// on.
func ReceiveFor(ctx context.Context, q db.DBTX, targets []Target, msgs []Incoming) (ReceiveResult, error) {
	return ReceiveWith(ctx, q, msgs, ReceiveOptions{Targets: targets})
}

// ReceiveWith stores a batch of messages in the inbox in one statement: one
// row per message and target, deduplicated by (handler, dedup key) (INSERT
// ... ON CONFLICT DO NOTHING); when some rows were not inserted, one more
// statement reads their stored fingerprints. q is a pool or the caller's transaction; the
// broker should be acknowledged only once it committed, and a redelivery after
// a crash between commit and ack is reported as absorbed. A delivery whose key
// is already stored with another payload (fingerprint) is a conflict: it is
// recorded in inbox_conflicts in the same transaction (a second statement,
// only when there are conflicts) and reported; the stored event stands. A
// message whose key cannot be built (a payload lacking a named field) is
// stored dead for that target with the reason, under the reserved key
// '!'+event id. A message that cannot be stored at all (invalid event id, NUL
// bytes or invalid UTF-8 in a text field) fails the whole call with an
// *InvalidMessageError and nothing is stored. Unless opts.NoDuplicateRecord,
// the insert statement itself records the duplicates it refused in
// inbox_duplicates and counts the batch in inbox_receive_counts. A delivery
// with a key sequence absorbed by a row of another sequence (a content-hash
// or business key matched another event of the key) has its sequence
// recorded as delivered for ordered apply, in more statements (only then):
// see docs/architecture.md, "Ordered apply".
func ReceiveWith(ctx context.Context, q db.DBTX, msgs []Incoming, opts ReceiveOptions) (ReceiveResult, error) {
	targets := opts.Targets
	var res ReceiveResult
	if len(msgs) == 0 {
		return res, nil
	}
	if len(targets) == 0 {
		targets = DefaultTargets
	}
	if err := ValidateTargets(targets); err != nil {
		return res, fmt.Errorf("inbox: receive: %w", err)
	}
	n := len(msgs) * len(targets)
	p := db.InsertInboxParams{
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
		RecordDuplicates:  !opts.NoDuplicateRecord,
	}
	type rowKey struct{ handler, key string }
	type rowRef struct {
		msg    int
		target int
	}
	first := make(map[rowKey]int, n) // row key → message index of its first copy
	rows := make(map[rowKey]rowRef, n)
	absorbedFor := make([]int, len(msgs)) // targets that absorbed each message
	fps := make([][]byte, len(msgs))
	fingerprint := func(i int) []byte {
		if fps[i] == nil {
			fps[i] = Fingerprint(msgs[i].Payload)
		}
		return fps[i]
	}
	var conflicts []conflictRow
	var seqs absorbedSeqs
	now := time.Now()
	for i, m := range msgs {
		if err := validateIncoming(m); err != nil {
			return ReceiveResult{}, &InvalidMessageError{Index: i, EventID: m.EventID, Err: err}
		}
		headers := json.RawMessage("{}")
		if stored := m.StoredHeaders(); len(stored) > 0 {
			b, err := json.Marshal(stored)
			if err != nil {
				return ReceiveResult{}, &InvalidMessageError{Index: i, EventID: m.EventID, Err: err}
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
		for ti, t := range targets {
			handler := t.Handler
			if handler == "" {
				handler = DefaultHandlerName
			}
			strat := t.strategyFor(m.Message)
			deadReason := m.DeadReason
			key := m.EventID
			if !strat.IsMessageID() {
				if deadReason == "" {
					k, err := strat.Key(m.Message)
					if err != nil {
						deadReason = err.Error()
						res.KeyFailures = append(res.KeyFailures, KeyFailure{Handler: handler, EventID: m.EventID, Reason: deadReason})
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
			rk := rowKey{handler, key}
			if j, dup := first[rk]; dup {
				absorbedFor[i]++
				a := Absorbed{Handler: handler, DedupKey: key, EventID: m.EventID, StoredEventID: msgs[j].EventID}
				if !bytes.Equal(fingerprint(i), fingerprint(j)) {
					a.Conflict = true
					conflicts = append(conflicts, conflictRow{a: a, strategy: strat.String(), msg: i, storedFP: fingerprint(j)})
				}
				res.Absorbed = append(res.Absorbed, a)
				if m.KeySeq > 0 && (msgs[j].Key != m.Key || msgs[j].KeySeq != m.KeySeq) {
					seqs.add(handler, m.Key, m.KeySeq, key, msgs[j].Key == m.Key)
				}
				p.RepeatedHandlers = append(p.RepeatedHandlers, handler)
				p.RepeatedDedupKeys = append(p.RepeatedDedupKeys, key)
				p.RepeatedEventIds = append(p.RepeatedEventIds, m.EventID)
				continue
			}
			first[rk] = i
			rows[rk] = rowRef{msg: i, target: ti}
			p.Handlers = append(p.Handlers, handler)
			p.DedupKeys = append(p.DedupKeys, key)
			p.Fingerprints = append(p.Fingerprints, fingerprint(i))
			p.KeyStrategies = append(p.KeyStrategies, strat.String())
			p.EventIds = append(p.EventIds, m.EventID)
			p.Topics = append(p.Topics, m.Topic)
			p.Keys = append(p.Keys, m.Key)
			p.EventTypes = append(p.EventTypes, m.EventType)
			p.Payloads = append(p.Payloads, payload)
			p.Headers = append(p.Headers, headers)
			p.OccurredAts = append(p.OccurredAts, occurred)
			p.DeadReasons = append(p.DeadReasons, deadReason)
			p.KeySeqs = append(p.KeySeqs, m.KeySeq)
		}
	}
	sortRows(&p)
	inserted, err := db.New().InsertInbox(ctx, q, p)
	if err != nil {
		return ReceiveResult{}, fmt.Errorf("inbox: receive %d messages: %w", len(msgs), err)
	}
	res.Inserted = len(inserted)
	res.Stored = make([]StoredRow, len(inserted))
	for i, r := range inserted {
		res.Stored[i] = StoredRow{Handler: r.Handler, DedupKey: r.DedupKey}
	}
	if len(inserted) < len(p.Handlers) {
		// Only the rows not inserted are compared with what is stored: one
		// more set-based statement, for batches holding duplicates only.
		stored := make(map[rowKey]bool, len(inserted))
		for _, r := range inserted {
			stored[rowKey{r.Handler, r.DedupKey}] = true
		}
		var absent db.InboxStoredKeysParams
		for i := range p.Handlers {
			if rk := (rowKey{p.Handlers[i], p.DedupKeys[i]}); !stored[rk] {
				absent.Handlers = append(absent.Handlers, rk.handler)
				absent.DedupKeys = append(absent.DedupKeys, rk.key)
			}
		}
		got, err := db.New().InboxStoredKeys(ctx, q, absent)
		if err != nil {
			return ReceiveResult{}, fmt.Errorf("inbox: receive: read stored keys: %w", err)
		}
		found := make(map[rowKey]db.InboxStoredKeysRow, len(got))
		for _, g := range got {
			found[rowKey{g.Handler, g.DedupKey}] = g
		}
		for i := range absent.Handlers {
			rk := rowKey{absent.Handlers[i], absent.DedupKeys[i]}
			ref := rows[rk]
			a := Absorbed{Handler: rk.handler, DedupKey: rk.key, EventID: msgs[ref.msg].EventID}
			g, ok := found[rk]
			if m := msgs[ref.msg]; m.KeySeq > 0 && (!ok || g.Key != m.Key || g.KeySeq == nil || *g.KeySeq != m.KeySeq) {
				// Another sequence than the stored row's own (a redelivery
				// carries the same).
				seqs.add(rk.handler, m.Key, m.KeySeq, rk.key, !ok || g.Key == m.Key)
			}
			if ok {
				// A row deleted again meanwhile (retention, purge) is
				// absorbed all the same, with nothing to compare.
				a.StoredEventID = g.EventID
				if !bytes.Equal(g.Fingerprint, fingerprint(ref.msg)) {
					a.Conflict = true
					conflicts = append(conflicts, conflictRow{a: a, strategy: targets[ref.target].strategyFor(msgs[ref.msg].Message).String(),
						msg: ref.msg, storedFP: g.Fingerprint})
				}
			}
			res.Absorbed = append(res.Absorbed, a)
			absorbedFor[ref.msg]++
		}
	}
	if len(conflicts) > 0 {
		if err := recordConflicts(ctx, q, conflicts, msgs, fingerprint); err != nil {
			return ReceiveResult{}, err
		}
	}
	if len(seqs) > 0 {
		// Rare: only deliveries absorbed by a row of another sequence.
		if res.SeqsWoken, err = seqs.record(ctx, q); err != nil {
			return ReceiveResult{}, fmt.Errorf("inbox: receive: record %d absorbed key sequences: %w", len(seqs), err)
		}
	}
	for i, m := range msgs {
		if absorbedFor[i] == len(targets) {
			res.Duplicates = append(res.Duplicates, m.EventID)
		}
	}
	return res, nil
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
