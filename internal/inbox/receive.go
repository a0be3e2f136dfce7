package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

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

// ReceiveResult reports what Receive stored.
type ReceiveResult struct {
	// Inserted counts the rows stored.
	Inserted int
	// Duplicates lists the event ids not stored because they were already in
	// the inbox or repeated earlier in the same batch (once per repetition).
	Duplicates []string
}

// ReceiveOptions tunes ReceiveWith. The zero value is Receive's behaviour.
type ReceiveOptions struct {
	// Handler names what the receiving consumer runs; it is recorded with
	// each duplicate. Default: empty.
	Handler string
	// NoDuplicateRecord skips recording duplicates in inbox_duplicates and
	// counting the batch in inbox_receive_counts (the console's dedup feed
	// and hit rate). Default false: both are written by the insert statement
	// itself.
	NoDuplicateRecord bool
}

// Receive stores a batch of messages in the inbox in one statement,
// deduplicated by event id (INSERT ... ON CONFLICT (event_id) DO NOTHING). q is
// a pool or the caller's transaction; the broker should be acknowledged only
// once it committed, and a redelivery after a crash between commit and ack is
// reported as a duplicate. A message that cannot be stored (invalid event id,
// NUL bytes or invalid UTF-8 in a text field) fails the whole call with an
// *InvalidMessageError and nothing is stored. The same statement records the
// duplicates it refused in inbox_duplicates and counts the batch in
// inbox_receive_counts (see ReceiveWith).
func Receive(ctx context.Context, q db.DBTX, msgs []Incoming) (ReceiveResult, error) {
	return ReceiveWith(ctx, q, msgs, ReceiveOptions{})
}

// ReceiveWith is Receive with options.
func ReceiveWith(ctx context.Context, q db.DBTX, msgs []Incoming, opts ReceiveOptions) (ReceiveResult, error) {
	var res ReceiveResult
	if len(msgs) == 0 {
		return res, nil
	}
	p := db.InsertInboxParams{
		EventIds:    make([]string, 0, len(msgs)),
		Topics:      make([]string, 0, len(msgs)),
		Keys:        make([]string, 0, len(msgs)),
		EventTypes:  make([]string, 0, len(msgs)),
		Payloads:    make([][]byte, 0, len(msgs)),
		Headers:     make([]json.RawMessage, 0, len(msgs)),
		OccurredAts: make([]time.Time, 0, len(msgs)),
		DeadReasons: make([]string, 0, len(msgs)),
		Handler:     opts.Handler,
		RepeatedIds: []string{},
		// Recorded by the insert statement itself: no extra round trip.
		RecordDuplicates: !opts.NoDuplicateRecord,
	}
	seen := make(map[string]struct{}, len(msgs))
	now := time.Now()
	for i, m := range msgs {
		if err := validateIncoming(m); err != nil {
			return ReceiveResult{}, &InvalidMessageError{Index: i, EventID: m.EventID, Err: err}
		}
		if _, dup := seen[m.EventID]; dup {
			res.Duplicates = append(res.Duplicates, m.EventID)
			p.RepeatedIds = append(p.RepeatedIds, m.EventID)
			continue
		}
		seen[m.EventID] = struct{}{}
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
		p.EventIds = append(p.EventIds, m.EventID)
		p.Topics = append(p.Topics, m.Topic)
		p.Keys = append(p.Keys, m.Key)
		p.EventTypes = append(p.EventTypes, m.EventType)
		p.Payloads = append(p.Payloads, payload)
		p.Headers = append(p.Headers, headers)
		p.OccurredAts = append(p.OccurredAts, occurred)
		p.DeadReasons = append(p.DeadReasons, m.DeadReason)
	}
	given := p.EventIds // reported in the caller's order
	sortByEventID(&p)
	inserted, err := db.New().InsertInbox(ctx, q, p)
	if err != nil {
		return ReceiveResult{}, fmt.Errorf("inbox: receive %d messages: %w", len(msgs), err)
	}
	res.Inserted = len(inserted)
	if len(inserted) < len(p.EventIds) {
		stored := make(map[string]struct{}, len(inserted))
		for _, id := range inserted {
			stored[id] = struct{}{}
		}
		for _, id := range given {
			if _, ok := stored[id]; !ok {
				res.Duplicates = append(res.Duplicates, id)
			}
		}
	}
	return res, nil
}

// sortByEventID orders the rows of p by event id: the insert then takes its
// unique-index locks in one global order, so that two consumers storing
// overlapping batches at the same time wait for each other instead of
// deadlocking.
func sortByEventID(p *db.InsertInboxParams) {
	idx := make([]int, len(p.EventIds))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return strings.Compare(p.EventIds[a], p.EventIds[b]) })
	p.EventIds = permute(p.EventIds, idx)
	p.Topics = permute(p.Topics, idx)
	p.Keys = permute(p.Keys, idx)
	p.EventTypes = permute(p.EventTypes, idx)
	p.Payloads = permute(p.Payloads, idx)
	p.Headers = permute(p.Headers, idx)
	p.OccurredAts = permute(p.OccurredAts, idx)
	p.DeadReasons = permute(p.DeadReasons, idx)
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
