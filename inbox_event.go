package pgrelay

import (
	"encoding/json"
	"time"

	"github.com/pgrelay/pgrelay/internal/db"
)

// claimed is the part of a claim row the worker needs, whichever claim query
// produced it.
type claimed struct {
	ev     InboxEvent
	status string
}

func fromClaimRow(r db.ClaimInboxRow) claimed {
	c := claimed{status: r.Status, ev: newEvent(r.EventID, r.Topic, r.Key, r.EventType, r.Payload,
		r.Headers, r.OccurredAt, r.ReceivedAt, r.Attempts, r.Deferrals, r.LockVersion, r.LastError)}
	c.ev.Handler, c.ev.DedupKey = r.Handler, r.DedupKey
	c.ev.KeySeq = seqOf(r.KeySeq)
	return c
}

func fromOrderedRow(r db.ClaimInboxOrderedRow) claimed {
	c := claimed{status: r.Status, ev: newEvent(r.EventID, r.Topic, r.Key, r.EventType, r.Payload,
		r.Headers, r.OccurredAt, r.ReceivedAt, r.Attempts, r.Deferrals, r.LockVersion, r.LastError)}
	c.ev.Handler, c.ev.DedupKey = r.Handler, r.DedupKey
	c.ev.KeySeq = seqOf(r.KeySeq)
	return c
}

func seqOf(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

func fromLostRow(r db.ClaimInboxLostRow) claimed {
	c := claimed{status: r.Status, ev: newEvent(r.EventID, r.Topic, r.Key, r.EventType, r.Payload,
		r.Headers, r.OccurredAt, r.ReceivedAt, r.Attempts, r.Deferrals, r.LockVersion, r.LastError)}
	c.ev.Handler, c.ev.DedupKey = r.Handler, r.DedupKey
	c.ev.KeySeq = seqOf(r.KeySeq)
	return c
}

func newEvent(id, topic, key, typ string, payload []byte, headers json.RawMessage, occurred, received time.Time,
	attempts, deferrals int32, version int64, lastErr *string) InboxEvent {
	ev := InboxEvent{
		Message: Message{
			EventID: id, Topic: topic, Key: key, EventType: typ, Payload: payload, OccurredAt: occurred,
		},
		ReceivedAt:  received,
		Attempts:    int(attempts),
		Deferrals:   int(deferrals),
		LockVersion: version,
	}
	if len(headers) > 0 {
		// Headers were written by Receive from a map[string]string; a row edited
		// by hand into another shape just yields no headers.
		_ = json.Unmarshal(headers, &ev.Headers)
		ev.liftContentType()
		ev.liftExpiresAt()
		ev.liftTrace()
	}
	if lastErr != nil {
		ev.LastError = *lastErr
	}
	return ev
}
