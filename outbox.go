package pgrelay

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/outbox"
)

// Outbox validation errors, wrapped with the offending message's index.
var (
	ErrMissingTopic    = outbox.ErrMissingTopic
	ErrPayloadTooLarge = outbox.ErrPayloadTooLarge
	ErrInvalidHeader   = outbox.ErrInvalidHeader
	// ErrPayloadNotText: ContentType says text or JSON and the payload is not
	// valid UTF-8.
	ErrPayloadNotText = outbox.ErrPayloadNotText
	// ErrInvalidSchedule: NotBefore or ExpiresAt out of the range of
	// OccurredAt, or a negative Delay.
	ErrInvalidSchedule = outbox.ErrInvalidSchedule
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
	ErrDuplicateEvent  = outbox.ErrDuplicateEvent
	ErrEventIDConflict = outbox.ErrEventIDConflict
	ErrKeySeqRace      = outbox.ErrKeySeqRace
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

// DefaultMaxPayloadBytes is the payload limit Enqueue applies: 1 MiB.
const DefaultMaxPayloadBytes = outbox.DefaultMaxPayloadBytes

// OutboxConfig configures an Outbox.
type OutboxConfig struct {
	// MaxPayloadBytes is the largest payload Enqueue accepts
	// (ErrPayloadTooLarge beyond). Default DefaultMaxPayloadBytes (1 MiB).
	MaxPayloadBytes int
}

// Outbox enqueues events with a chosen configuration; the function Enqueue
// uses the defaults.
type Outbox struct{ o *outbox.Outbox }

// NewOutbox returns an Outbox, or an error naming the invalid
// OutboxConfig field.
func NewOutbox(cfg OutboxConfig) (*Outbox, error) {
	if cfg.MaxPayloadBytes < 0 {
		return nil, fmt.Errorf("pgrelay: OutboxConfig.MaxPayloadBytes must not be negative, got %d", cfg.MaxPayloadBytes)
	}
	o, err := outbox.New(outbox.Config{MaxPayloadBytes: cfg.MaxPayloadBytes})
	if err != nil {
		return nil, err
	}
	return &Outbox{o: o}, nil
}

// Enqueue writes msgs to the outbox inside tx with o's configuration; see
// the function Enqueue.
func (o *Outbox) Enqueue(ctx context.Context, tx pgx.Tx, msgs ...Message) error {
	return o.o.Enqueue(ctx, tx, toEvents(msgs)...)
}

var defaultOutbox, _ = outbox.New(outbox.Config{})

// Enqueue writes msgs to the outbox inside tx: they are published if and only
// if tx commits. An empty EventID becomes a new UUIDv7, an empty Key the
// EventID (the event is then ordered with no other), a zero OccurredAt now;
// OccurredAt is rounded to the microsecond, as PostgreSQL stores it.
// Events sharing a Key are published in commit order. Every message is
// validated before any is written; the error names the message's index.
// Given an inbox handler's ctx, every message records the handled event as
// its cause (see CausedBy).
func Enqueue(ctx context.Context, tx pgx.Tx, msgs ...Message) error {
	return defaultOutbox.Enqueue(ctx, tx, toEvents(msgs)...)
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
// message already has. An inbox handler's ctx already does this for the event
// it handles when given to Enqueue; CausedBy is for other contexts, such as a
// batch handler, which handles many events at once:
//
//	pgrelay.Enqueue(ctx, tx, pgrelay.CausedBy(ev.Message, out)...)
func CausedBy(cause Message, msgs ...Message) []Message {
	return fromEvents(event.CausedBy(event.Message(cause), toEvents(msgs)...))
}
