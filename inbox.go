package pgrelay

import (
	"context"

	"github.com/pgrelay/pgrelay/internal/db"
	"github.com/pgrelay/pgrelay/internal/inbox"
)

// DBTX is what Receive and Release run on: a *pgxpool.Pool, a *pgx.Conn or a
// pgx.Tx.
type DBTX = db.DBTX

// Incoming is a message to store in the inbox. DeadReason, when non-empty,
// stores it directly as dead with that reason (malformed input, raw bytes kept
// in Payload), so that nothing received is lost.
type Incoming = inbox.Incoming

// ReceiveResult reports what Receive stored and which event ids were
// duplicates.
type ReceiveResult = inbox.ReceiveResult

// InboxEvent is a claimed inbox event, as a handler sees it.
type InboxEvent = inbox.Event

// InboxHandler runs an event's side effect inside the transaction that marks
// the event processed. See HandlerFunc.
type InboxHandler = inbox.Handler

// InboxBatchHandler is an InboxHandler that can also apply a whole batch at
// once (HandleBatch), typically one set-based statement per kind of effect, in
// the transaction that marks the batch processed with one statement. If
// HandleBatch returns an error, the batch is rolled back and run again event
// by event through Handle, each event isolated, so it may refuse anything
// that needs a per-event decision.
type InboxBatchHandler = inbox.BatchHandler

// HandlerFunc adapts a function to InboxHandler. Return nil on success,
// Permanent(err) for input that can never succeed, Defer(key) to wait for a
// dependency, and any other error to retry with backoff.
type HandlerFunc = inbox.HandlerFunc

// InboxConfig configures an inbox worker; every field documents its default.
type InboxConfig = inbox.Config

// InboxWorker runs handlers over the inbox; see NewInboxWorker.
type InboxWorker = inbox.Worker

// InboxObserver is told about every inbox state change, for metrics.
type InboxObserver = inbox.Observer

// InboxRetentionConfig configures the inbox's upkeep (InboxConfig.Retention),
// which an inbox worker runs by default: processed rows are deleted after
// the dedup window (7 days), old Release records, key conflicts and the
// duplicate record are pruned. Disabled leaves it to another process.
type InboxRetentionConfig = inbox.RetentionConfig

// InboxRetentionObserver is told what the inbox's upkeep deleted, for metrics.
type InboxRetentionObserver = inbox.RetentionObserver

// InvalidMessageError reports a message Receive refused (its whole batch was
// not stored).
type InvalidMessageError = inbox.InvalidMessageError

// DeferError is the error Defer returns.
type DeferError = inbox.DeferError

// Receive stores a batch of received messages in the inbox in one statement,
// deduplicated by event id, on a pool or inside the caller's transaction.
// Acknowledge the broker only after it committed.
func Receive(ctx context.Context, q DBTX, msgs []Incoming) (ReceiveResult, error) {
	return inbox.Receive(ctx, q, msgs)
}

// InboxTarget is one handler ReceiveFor stores rows for: a handler name and
// the key strategy that deduplicates its rows.
type InboxTarget = inbox.Target

// KeyStrategy builds an event's dedup key for one handler (ParseKeyStrategy).
type KeyStrategy = inbox.KeyStrategy

// DefaultHandlerName is the handler name used when none is given; inbox rows
// stored before handlers were named belong to it.
const DefaultHandlerName = inbox.DefaultHandlerName

// ParseKeyStrategy parses a dedup key strategy: "message-id" (the default),
// "business:payment:{order_id}", "content-hash", "content-hash:amount,currency",
// "hybrid:content-hash@1h" or "hybrid:content-hash@header:Producer-Id". See
// docs/architecture.md, "Inbox identity".
func ParseKeyStrategy(spec string) (KeyStrategy, error) { return inbox.ParseKeyStrategy(spec) }

// ReceiveFor stores a batch of received messages in one statement, one inbox
// row per message and target, each deduplicated by (handler, dedup key). A
// key already stored with a different payload is a conflict: recorded in
// inbox_conflicts and reported in the result; the stored event stands.
func ReceiveFor(ctx context.Context, q DBTX, targets []InboxTarget, msgs []Incoming) (ReceiveResult, error) {
	return inbox.ReceiveFor(ctx, q, targets, msgs)
}

// NotifyInbox wakes the inbox workers of every process when q's transaction
// commits. Receive does not wake anyone: a process running its workers itself
// calls InboxWorker.Wake after its commit; one storing events for workers
// elsewhere calls NotifyInbox in the transaction. Otherwise the workers find
// the events at their next poll (InboxConfig.PollInterval).
func NotifyInbox(ctx context.Context, q DBTX) error { return inbox.Notify(ctx, q) }

// NewInboxWorker returns a worker that processes the inbox with cfg.Handler
// once Run is called. It fails if cfg is invalid, naming the field.
func NewInboxWorker(cfg InboxConfig) (*InboxWorker, error) { return inbox.NewWorker(cfg) }

// Permanent marks a handler error as permanent: the event goes dead with the
// error as its reason instead of being retried.
func Permanent(err error) error { return inbox.Permanent(err) }

// Defer is returned by a handler whose event must wait for a dependency (for
// example "order:42"); the event runs again once Release is called with the
// same key, without using up an attempt.
func Defer(waitingFor string) error { return inbox.Defer(waitingFor) }

// Release makes the events deferred on each of waitingFor due at once, in one
// statement; call it from a handler, with its transaction, when it creates what
// they wait for. It takes no lock beyond the rows it writes, so it never waits
// for another batch's deferral.
func Release(ctx context.Context, q DBTX, waitingFor ...string) error {
	return inbox.Release(ctx, q, waitingFor...)
}
