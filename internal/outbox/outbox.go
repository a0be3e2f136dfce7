// Package outbox writes events into the outbox table inside the caller's
// transaction. The relay (internal/relay) publishes them once that transaction
// commits.
package outbox

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

// DefaultMaxPayloadBytes is the default limit on a message's payload: 1 MiB,
// NATS's default maximum message size.
const DefaultMaxPayloadBytes = 1 << 20

// Errors returned by Enqueue, wrapped with the offending message's position.
var (
	ErrMissingTopic    = errors.New("topic is required")
	ErrPayloadTooLarge = errors.New("payload too large")
	ErrInvalidHeader   = errors.New("header is invalid")
	// ErrPayloadNotText: the content type says text or JSON (see
	// event.IsTextContentType) and the payload is not valid UTF-8.
	ErrPayloadNotText = errors.New("payload is not text")
	// ErrInvalidSchedule: NotBefore or ExpiresAt out of range, or a negative
	// Delay.
	ErrInvalidSchedule = errors.New("schedule is invalid")
)

// Errors returned by Enqueue for an event id that is already in the outbox
// (or repeated within one call). Neither aborts the caller's transaction: the
// other messages of the call are written, and the caller decides whether to
// commit.
var (
	// ErrDuplicateEvent: the stored event is identical to the message (same
	// topic, effective key, event type, payload bytes and headers; OccurredAt
	// is not compared). The message was not written again; a producer that
	// retries may treat this as success.
	ErrDuplicateEvent = errors.New("event already enqueued")
	// ErrEventIDConflict: the stored event differs from the message in at
	// least one of those fields. The message was not written; the stored
	// event stands.
	ErrEventIDConflict = errors.New("event id already used by a different event")
	// ErrKeySeqRace: a REPEATABLE READ or SERIALIZABLE transaction enqueued
	// an event of a key whose later events another producer committed after
	// this transaction's snapshot was taken, so the number it would give the
	// event is taken. The transaction is aborted; retry it, as for a
	// serialization failure. READ COMMITTED producers never see it.
	ErrKeySeqRace = errors.New("a concurrent producer of the same key committed after this transaction's snapshot; retry the transaction")
)

// Config configures an Outbox.
type Config struct {
	// MaxPayloadBytes is the largest payload Enqueue accepts, in bytes.
	// Default: DefaultMaxPayloadBytes (1 MiB).
	MaxPayloadBytes int
}

// WithDefaults returns the config with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.MaxPayloadBytes == 0 {
		c.MaxPayloadBytes = DefaultMaxPayloadBytes
	}
	return c
}

func (c Config) validate() error {
	if c.MaxPayloadBytes < 0 {
		return fmt.Errorf("outbox: MaxPayloadBytes must not be negative, got %d", c.MaxPayloadBytes)
	}
	return nil
}

// Outbox enqueues events. It holds no connection: every call runs in the
// transaction it is given. It is safe for concurrent use.
type Outbox struct {
	cfg Config
	q   *db.Queries
}

// New returns an Outbox, or an error naming the invalid Config field.
func New(cfg Config) (*Outbox, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Outbox{cfg: cfg, q: db.New()}, nil
}

// Enqueue writes msgs to the outbox inside tx, in one statement. The events
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
// When ctx carries a cause (event.WithCause; the inbox worker gives each
// handler's context the event it handles), every message without them gets
// the Pgrelay-Causation-Id and Pgrelay-Correlation-Id headers of that cause
// (event.CausedBy).
func (o *Outbox) Enqueue(ctx context.Context, tx pgx.Tx, msgs ...event.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	// A handler's context carries the event it handles: record it as the
	// cause of what the handler enqueues.
	msgs = event.WithCauseFromContext(ctx, msgs)
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
		if stored := m.StoredHeaders(); len(stored) > 0 {
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
func traceColumns(msgs []event.Message) (parents, states []string) {
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

func (o *Outbox) validate(m event.Message) error {
	if m.Topic == "" {
		return ErrMissingTopic
	}
	if !validToken(m.Topic, true) {
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
		if !validToken(k, false) {
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

// ValidTopic reports whether topic follows the rule Enqueue applies and the
// outbox table's outbox_topic_valid constraint holds plain SQL to: 1 to 255
// bytes of letters, digits, '-' and '_' in non-empty parts separated by '.'.
func ValidTopic(topic string) bool { return validToken(topic, true) }

// validToken reports whether s is usable as a broker subject part (dots
// allowed when dots is set, then with no empty part) or header name.
func validToken(s string, dots bool) bool {
	if s == "" || len(s) > 255 {
		return false
	}
	prevDot := true
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
			prevDot = false
		case r == '.' && dots:
			if prevDot {
				return false
			}
			prevDot = true
		default:
			return false
		}
	}
	return !prevDot || !dots
}
