// Package outbox writes events into the outbox table inside the caller's
// transaction. The relay (internal/relay) publishes them once that transaction
// commits.
package pgrelay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgrelay/pgrelay/internal/db"
	"github.com/pgrelay/pgrelay/internal/event"
)

// DefaultMaxPayloadBytes is the payload limit Enqueue applies: 1 MiB.
const DefaultMaxPayloadBytes = 1 << 20

// Outbox validation errors, wrapped with the offending message's index.
var (
	ErrMissingTopic    = errors.New("topic is required")
	ErrPayloadTooLarge = errors.New("payload too large")
	ErrInvalidHeader   = errors.New("header is invalid")
	// ErrPayloadNotText: ContentType says text or JSON and the payload is not
	// valid UTF-8.
	ErrPayloadNotText = errors.New("payload is not text")
	// ErrInvalidSchedule: NotBefore or ExpiresAt out of the range of
	// OccurredAt, or a negative Delay.
	ErrInvalidSchedule = errors.New("schedule is invalid")
	// ErrOccurredAtOutOfRange: OccurredAt must be after 0001-01-01T00:00:00Z
	// and at most 9999-12-31T23:59:59.999999Z once rounded to the microsecond.
	ErrOccurredAtOutOfRange = event.ErrOccurredAtOutOfRange
)

// Errors returned by Enqueue for an event id already in the outbox. Neither
// aborts the caller's transaction. ErrDuplicateEvent means the stored event is
// identical (topic, key, event type, payload, headers): a retrying producer
// may treat it as success. ErrEventIDConflict means it differs: the stored
// event stands and the message was not written. ErrKeySeqRace aborts it: a
// REPEATABLE READ or SERIALIZABLE producer raced a producer of the same key
// and must retry its transaction (READ COMMITTED producers never see it).
var (
	ErrDuplicateEvent  = errors.New("event already enqueued")
	ErrEventIDConflict = errors.New("event id already used by a different event")
	ErrKeySeqRace      = errors.New("a concurrent producer of the same key committed after this transaction's snapshot; retry the transaction")
)

// HeaderContentType is the broker header (and the key in the outbox's and
// inbox's headers column) that carries Message.ContentType.
const HeaderContentType = event.HeaderContentType

// HeaderExpiresAt is the broker header (and the key in the inbox's headers
// column) that carries Message.ExpiresAt, in RFC 3339 with nanoseconds.
const HeaderExpiresAt = event.HeaderExpiresAt

// IsTextContentType reports whether a content type says text or JSON, the
// only payloads that must be UTF-8; every other payload is opaque bytes.
func IsTextContentType(ct string) bool { return event.IsTextContentType(ct) }

// OutboxConfig configures an Outbox.
type OutboxConfig struct {
	// MaxPayloadBytes is the largest payload Enqueue accepts
	// (ErrPayloadTooLarge beyond). Default DefaultMaxPayloadBytes (1 MiB).
	MaxPayloadBytes int
}

// Outbox enqueues events with a chosen configuration; the function Enqueue
// uses the defaults. It holds no connection: every call runs in the
// transaction it is given. It is safe for concurrent use.
type Outbox struct {
	cfg OutboxConfig
	q   *db.Queries
}

// NewOutbox returns an Outbox, or an error naming the invalid
// OutboxConfig field.
func NewOutbox(cfg OutboxConfig) (*Outbox, error) {
	if cfg.MaxPayloadBytes < 0 {
		return nil, fmt.Errorf("pgrelay: OutboxConfig.MaxPayloadBytes must not be negative, got %d", cfg.MaxPayloadBytes)
	}
	if cfg.MaxPayloadBytes == 0 {
		cfg.MaxPayloadBytes = DefaultMaxPayloadBytes
	}
	return &Outbox{cfg: cfg, q: db.New()}, nil
}

var defaultOutbox, _ = NewOutbox(OutboxConfig{})

// Enqueue writes msgs to the outbox inside tx: they are published if and only
// if tx commits. An empty EventID becomes a new UUIDv7, an empty Key the
// EventID (the event is then ordered with no other), a zero OccurredAt now;
// OccurredAt is rounded to the microsecond, as PostgreSQL stores it.
// Events sharing a Key are published in commit order. Every message is
// validated before any is written; the error names the message's index.
// Given an inbox handler's ctx, every message records the handled event as
// its cause (see CausedBy).
func Enqueue(ctx context.Context, tx pgx.Tx, msgs ...Message) error {
	return defaultOutbox.Enqueue(ctx, tx, msgs...)
}

// Headers linking an event to the one whose handling produced it: the
// cause's event id, and the id of the chain it belongs to (the cause's
// correlation id, or the cause's event id when it starts the chain). The relay
// publishes them under these names; Message.CausationID and
// Message.CorrelationID read them.
const (
	HeaderCausationID   = event.HeaderCausationID
	HeaderCorrelationID = event.HeaderCorrelationID
)

// CausedBy returns copies of msgs recording cause as the event they follow
// from (HeaderCausationID, HeaderCorrelationID), keeping either header a
// message already has; msgs are not modified. An inbox handler's ctx already
// does this for the event it handles when given to Enqueue; CausedBy is for
// other contexts, such as a batch handler, which handles many events at once:
//
//	pgrelay.Enqueue(ctx, tx, pgrelay.CausedBy(ev.Message, out)...)
func CausedBy(cause Message, msgs ...Message) []Message {
	out := make([]Message, len(msgs))
	for i, m := range msgs {
		out[i] = withCause(m, cause.EventID, cause.CorrelationID())
	}
	return out
}

// Enqueue writes msgs to the outbox inside tx, in one statement, with o's
// configuration. The events
// are published if and only if tx commits. Defaults, applied to a copy:
// EventID a new UUIDv7, Key the EventID (no ordering with other events),
// OccurredAt now. Messages sharing a Key are published in commit order, and in
// slice order within one call. Enqueue validates every message before writing
// any; a validation error names the message's index and the problem.
//
// An event id already in the outbox (or repeated within the call) does not
// fail the insert, so tx stays usable: that message is skipped, the others
// are written, and Enqueue returns ErrDuplicateEvent when every skipped
// message is identical to the stored event, ErrEventIDConflict otherwise.
// Identical means the same topic, effective key (an empty Key is the event
// id), event type, payload bytes and headers (as a map); OccurredAt is not
// compared. Deduplication holds while the stored row is kept: retention
// deletes published rows, after which the id can be enqueued again.
//
// Writers of one key are serialized: the transaction holds a lock per key
// until it commits. Within one call the locks are taken in one fixed order
// (whatever the order of msgs), so concurrent calls cannot deadlock. Across
// calls in one transaction the earlier calls' locks are already held: a
// transaction that enqueues several keys should do so in one call, or in
// one consistent order (sorted keys) across calls. Otherwise two such
// transactions can deadlock; PostgreSQL then aborts one of them (SQLSTATE
// 40P01), which can be retried.
//
// When ctx carries a cause (contextWithCause; the inbox worker gives each
// handler's context the event it handles), every message without them gets
// the Pgrelay-Causation-Id and Pgrelay-Correlation-Id headers of that cause
// (CausedBy).
func (o *Outbox) Enqueue(ctx context.Context, tx pgx.Tx, msgs ...Message) error {
	if len(msgs) == 0 {
		return nil
	}
	// A handler's context carries the event it handles: record it as the
	// cause of what the handler enqueues.
	msgs = causeFromContext(ctx, msgs)
	n := len(msgs)
	p := db.EnqueueOutboxIdempotentParams{
		EventIds:    make([]string, n),
		Topics:      make([]string, n),
		Keys:        make([]string, n),
		EventTypes:  make([]string, n),
		Payloads:    make([][]byte, n),
		Headers:     make([]json.RawMessage, n),
		OccurredAts: make([]time.Time, n),
		NotBefores:  make([]time.Time, n), // zero: none (the query's NULL)
		DelaysUs:    make([]int64, n),
		ExpiresAts:  make([]time.Time, n), // zero: none
	}
	p.Traceparents, p.Tracestates = traceColumns(msgs)
	now := time.Now().Round(time.Microsecond)
	var keys []string // the explicit keys, whose locks the insert takes
	for i, m := range msgs {
		if err := o.validate(m); err != nil {
			return fmt.Errorf("outbox: message %d: %w", i, err)
		}
		id := m.EventID
		if id == "" {
			u, err := uuid.NewV7()
			if err != nil {
				return fmt.Errorf("outbox: message %d: generate event id: %w", i, err)
			}
			id = u.String()
		}
		key := m.Key
		if key == "" {
			key = id
		} else {
			keys = append(keys, key)
		}
		headers := json.RawMessage(`{}`)
		if stored := m.storedHeaders(); len(stored) > 0 {
			b, err := json.Marshal(stored)
			if err != nil {
				return fmt.Errorf("outbox: message %d: headers: %w", i, err)
			}
			headers = b
		}
		occurred := now
		if !m.OccurredAt.IsZero() {
			occurred, _ = event.NormalizeOccurredAt(m.OccurredAt) // validated above
		}
		payload := m.Payload
		if payload == nil {
			payload = []byte{}
		}
		p.EventIds[i], p.Topics[i], p.Keys[i], p.EventTypes[i] = id, m.Topic, key, m.EventType
		p.Payloads[i], p.Headers[i], p.OccurredAts[i] = payload, headers, occurred
		if !m.NotBefore.IsZero() {
			p.NotBefores[i] = m.NotBefore.Round(time.Microsecond).UTC()
		}
		if m.Delay > 0 {
			// Resolved by the insert against the database's clock.
			p.DelaysUs[i] = max(m.Delay.Microseconds(), 1)
		}
		if !m.ExpiresAt.IsZero() {
			p.ExpiresAts[i] = m.ExpiresAt.Round(time.Microsecond).UTC()
		}
	}
	if len(keys) > 1 {
		// Take the key locks in one global order before the insert takes them
		// in message order, so concurrent batches cannot deadlock.
		if err := o.q.LockOutboxKeys(ctx, tx, keys); err != nil {
			return fmt.Errorf("outbox: lock keys: %w", err)
		}
	}
	inserted, err := o.q.EnqueueOutboxIdempotent(ctx, tx, p)
	if err != nil {
		if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == "outbox_key_seq_idx" {
			return fmt.Errorf("outbox: insert %d messages: %w: %w", n, ErrKeySeqRace, err)
		}
		return fmt.Errorf("outbox: insert %d messages: %w", n, err)
	}
	if len(inserted) == n {
		return nil
	}
	return o.duplicates(ctx, tx, p, inserted)
}

// duplicates compares the messages whose insert was skipped with the stored
// events of the same id, and returns ErrDuplicateEvent or ErrEventIDConflict
// for each, joined. When any is a conflict, only the conflicts are returned.
func (o *Outbox) duplicates(ctx context.Context, tx pgx.Tx, p db.EnqueueOutboxIdempotentParams, inserted []string) error {
	left := make(map[string]int, len(inserted)) // inserted ids, counted: a repeated id is inserted once
	for _, id := range inserted {
		left[id]++
	}
	var skipped []int
	for i, id := range p.EventIds {
		if left[id] > 0 {
			left[id]--
			continue
		}
		skipped = append(skipped, i)
	}
	ids := make([]string, len(skipped))
	for j, i := range skipped {
		ids[j] = p.EventIds[i]
	}
	stored, err := o.q.OutboxEventsByID(ctx, tx, ids)
	if err != nil {
		return fmt.Errorf("outbox: read stored events of duplicate ids: %w", err)
	}
	byID := make(map[string]db.OutboxEventsByIDRow, len(stored))
	for _, r := range stored {
		byID[r.EventID] = r
	}
	var dups, conflicts []error
	for _, i := range skipped {
		id := p.EventIds[i]
		r, ok := byID[id]
		switch {
		case !ok:
			// Skipped by the insert, yet not visible: a concurrent
			// transaction's row this snapshot cannot see.
			conflicts = append(conflicts, fmt.Errorf("outbox: message %d: event id %q: %w (stored row not visible to this transaction)", i, id, ErrEventIDConflict))
		case r.Topic == p.Topics[i] && r.Key == p.Keys[i] && r.EventType == p.EventTypes[i] &&
			bytes.Equal(r.Payload, p.Payloads[i]) && sameHeaders(r.Headers, p.Headers[i]):
			dups = append(dups, fmt.Errorf("outbox: message %d: event id %q: %w", i, id, ErrDuplicateEvent))
		default:
			conflicts = append(conflicts, fmt.Errorf("outbox: message %d: event id %q: %w (stored topic %q key %q type %q)",
				i, id, ErrEventIDConflict, r.Topic, r.Key, r.EventType))
		}
	}
	if len(conflicts) > 0 {
		// Only the conflicts: a caller that treats ErrDuplicateEvent as
		// success must not see it when a conflict happened too.
		return errors.Join(conflicts...)
	}
	return errors.Join(dups...)
}

// traceColumns returns the messages' trace contexts, one per message ("" for
// none, stored as NULL).
func traceColumns(msgs []Message) (parents, states []string) {
	parents, states = make([]string, len(msgs)), make([]string, len(msgs))
	for i, m := range msgs {
		parents[i], states[i] = m.TraceParent, m.TraceState
	}
	return parents, states
}

// sameHeaders compares two header objects as maps of strings, so that key
// order and JSON spacing do not matter.
func sameHeaders(a, b json.RawMessage) bool {
	var x, y map[string]string
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return bytes.Equal(a, b)
	}
	return maps.Equal(x, y)
}

func (o *Outbox) validate(m Message) error {
	if m.Topic == "" {
		return ErrMissingTopic
	}
	if !event.ValidToken(m.Topic, true) {
		// The same rule as the outbox table's outbox_topic_valid constraint
		// (migration 00095), which holds plain-SQL producers to it.
		return fmt.Errorf("topic %q is invalid: use letters, digits, '-', '_' and '.' between non-empty parts, at most 255 bytes", m.Topic)
	}
	if m.EventID != "" {
		if err := event.ValidateEventID(m.EventID); err != nil {
			return err
		}
	}
	// The key and the event type travel as broker headers, which cannot
	// carry a line break: refuse it rather than see it rewritten. PostgreSQL
	// text cannot hold NUL or invalid UTF-8: refuse them here, naming the
	// field, rather than let the insert fail.
	if err := textField("key", m.Key); err != nil {
		return err
	}
	if err := event.ValidateKey(m.Key); err != nil {
		return err
	}
	if err := textField("event type", m.EventType); err != nil {
		return err
	}
	if !m.OccurredAt.IsZero() {
		if _, err := event.NormalizeOccurredAt(m.OccurredAt); err != nil {
			return err
		}
	}
	if err := timeField("NotBefore", m.NotBefore); err != nil {
		return err
	}
	if err := timeField("ExpiresAt", m.ExpiresAt); err != nil {
		return err
	}
	if m.Delay < 0 {
		return fmt.Errorf("%w: Delay must not be negative, got %s", ErrInvalidSchedule, m.Delay)
	}
	if m.Delay > maxDelay {
		return fmt.Errorf("%w: Delay must be at most %s, got %s", ErrInvalidSchedule, maxDelay, m.Delay)
	}
	if len(m.Payload) > o.cfg.MaxPayloadBytes {
		return fmt.Errorf("%w: %d bytes, the limit is %d", ErrPayloadTooLarge, len(m.Payload), o.cfg.MaxPayloadBytes)
	}
	if reason := event.ValidTraceContext(m.TraceParent, m.TraceState); reason != "" {
		return errors.New(reason)
	}
	if err := textField("content type", m.ContentType); err != nil {
		return err
	}
	if _, ok := m.Headers[event.HeaderContentType]; ok && m.ContentType != "" {
		return fmt.Errorf("%w: %s is set both as ContentType and as a header", ErrInvalidHeader, event.HeaderContentType)
	}
	if event.IsTextContentType(m.ContentType) && !utf8.Valid(m.Payload) {
		return fmt.Errorf("%w: content type %q says text, but the payload is not valid UTF-8", ErrPayloadNotText, m.ContentType)
	}
	for k, v := range m.Headers {
		if !event.ValidToken(k, false) {
			return fmt.Errorf("%w: name %q: use letters, digits, '-' and '_'", ErrInvalidHeader, k)
		}
		if err := textField(fmt.Sprintf("value of %q", k), v); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidHeader, err)
		}
	}
	return nil
}

// maxDelay is the longest Message.Delay accepted: 100 years.
const maxDelay = 100 * 365 * 24 * time.Hour

// timeField checks a NotBefore or ExpiresAt: zero (none) or within the range
// PostgreSQL stores and the broker header carries (the range of OccurredAt).
func timeField(name string, t time.Time) error {
	if t.IsZero() {
		return nil
	}
	if _, err := event.NormalizeOccurredAt(t); err != nil {
		return fmt.Errorf("%w: %s %s is out of range (after 0001-01-01T00:00:00Z, at most 9999-12-31T23:59:59.999999Z)", ErrInvalidSchedule, name, t.UTC().Format(time.RFC3339Nano))
	}
	return nil
}

// textField checks that a value carried as a broker header and stored as
// PostgreSQL text is valid UTF-8 without NUL or line breaks.
func textField(name, v string) error {
	switch {
	case !utf8.ValidString(v):
		return fmt.Errorf("%s is not valid UTF-8", name)
	case strings.ContainsRune(v, 0):
		return fmt.Errorf("%s contains a NUL character", name)
	case strings.ContainsAny(v, "\r\n"):
		return fmt.Errorf("%s %q contains a line break", name, v)
	}
	return nil
}
