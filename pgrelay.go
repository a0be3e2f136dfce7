// Package pgrelay is a PostgreSQL-native transactional outbox and inbox.
//
// Applications write events into the outbox inside their own pgx transaction
// (Enqueue); the relay publishes committed rows to the broker. Consumers store
// every received message in the inbox, deduplicated by event id, and run
// handlers whose side effects commit in the same transaction as the inbox
// row's processed mark, so each event's effect happens exactly once.
package pgrelay

import "github.com/pgrelay/pgrelay/internal/event"

// Message is one event: what Enqueue writes to the outbox, what the relay
// publishes, and what the inbox receives. See the field docs for limits.
type Message = event.Message
