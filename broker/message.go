package broker

import "github.com/pgrelay/pgrelay/internal/event"

// Message is one event, as the relay publishes it and a Subscriber delivers
// it. It has exactly the fields of pgrelay.Message (see there: EventID,
// Topic, Key, KeySeq, EventType, Payload, ContentType, Headers, OccurredAt,
// TraceParent, TraceState),
// so either converts to the other: pgrelay.Message(m), broker.Message(pm).
type Message = event.Message
