package pgrelay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DBTX is what Receive, ReceiveFor, Release, NotifyInbox and ListWaiting run
// on: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Incoming is a message to store in the inbox. DeadReason, when non-empty,
// stores it directly as dead with that reason (malformed input, raw bytes kept
// in Payload), so that nothing received is lost.
type Incoming struct {
	Message
	DeadReason string
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
	// key strategy could not build a key.
	KeyFailures []KeyFailure
	// SeqsWoken counts the events of ordered handlers made due because a
	// delivery absorbed by a row of another sequence of their key filled
	// the sequence they waited for: like Inserted, a reason to wake the
	// workers (InboxWorker.Wake, NotifyInbox).
	SeqsWoken int64

	stored []storedRow // the rows this call inserted, dead ones included
}

// Absorbed is a delivery the inbox did not store for a handler because the
// handler's dedup key was already stored.
type Absorbed struct {
	// Handler, DedupKey and EventID name the delivery and its key.
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

// InvalidMessageError reports a message Receive refused; nothing of its batch
// was stored. The caller can store it as dead instead (Incoming.DeadReason).
type InvalidMessageError struct {
	// Index is the message's position in the batch.
	Index int
	// EventID is the message's event id as received (possibly empty).
	EventID string
	// Err says what is wrong.
	Err error
}

func (e *InvalidMessageError) Error() string {
	return fmt.Sprintf("pgrelay: message %d (event_id %q): %v", e.Index, e.EventID, e.Err)
}

// Unwrap returns Err.
func (e *InvalidMessageError) Unwrap() error { return e.Err }

// Validate reports why Receive would refuse m (the Err of its
// *InvalidMessageError), or nil: an invalid event id, a NUL byte or invalid
// UTF-8 in a text field, a key or trace context too long.
func (m Incoming) Validate() error { return validateIncoming(m) }

// Receive stores a batch of received messages in the inbox in one statement,
// for the default handler (DefaultHandlerName), deduplicated by event id, on a
// pool or inside the caller's transaction. Acknowledge the broker only after
// it committed. A message that cannot be stored fails the whole batch with an
// *InvalidMessageError.
func Receive(ctx context.Context, q DBTX, msgs []Incoming) (ReceiveResult, error) {
	return ReceiveWith(ctx, q, msgs, ReceiveOptions{})
}

// Target is one handler ReceiveFor (and a consumer) stores rows for: a
// handler name and the key strategy that deduplicates its rows.
type Target struct {
	// Handler is the handler's name: letters, digits, '.', '_' and '-'.
	// Default DefaultHandlerName.
	Handler string
	// DedupKey is the key strategy spec that builds the dedup key of the
	// handler's rows: "message-id" (the default), "business:payment:{order_id}",
	// "content-hash", "content-hash:amount,currency", "hybrid:content-hash@1h"
	// or "hybrid:content-hash@header:Producer-Id". See docs/architecture.md,
	// "Inbox identity".
	DedupKey string
	// DedupKeyByTopic overrides DedupKey for the messages of the named
	// topics: topic → key strategy spec. Default: none.
	DedupKeyByTopic map[string]string
}

// parseTargets parses targets' key strategies; an error names
// targets[i].DedupKey (or DedupKeyByTopic[topic]) under field.
func parseTargets(field string, targets []Target) ([]target, error) {
	out := make([]target, len(targets))
	var errs []error
	for i, t := range targets {
		var err error
		if out[i], err = t.parse(); err != nil {
			errs = append(errs, fmt.Errorf("%s[%d].%w", field, i, err))
		}
	}
	return out, errors.Join(errs...)
}

// parse parses t's key strategies; an error names the field.
func (t Target) parse() (target, error) {
	out := target{Handler: t.Handler}
	var errs []error
	s, err := parseKeyStrategy(t.DedupKey)
	if err != nil {
		errs = append(errs, fmt.Errorf("DedupKey: %w", err))
	}
	out.Strategy = s
	for topic, spec := range t.DedupKeyByTopic {
		s, err := parseKeyStrategy(spec)
		if err != nil {
			errs = append(errs, fmt.Errorf("DedupKeyByTopic[%q]: %w", topic, err))
			continue
		}
		if out.ByTopic == nil {
			out.ByTopic = map[string]keyStrategy{}
		}
		out.ByTopic[topic] = s
	}
	return out, errors.Join(errs...)
}

// ValidateTargets checks targets as ReceiveFor does: handler names (see
// ValidateHandlerName), no handler named twice, and the key strategy specs
// (an error names targets[i].DedupKey or DedupKeyByTopic).
func ValidateTargets(targets []Target) error {
	ts, err := parseTargets("targets", targets)
	if err != nil {
		return err
	}
	return validateTargets(ts)
}

// ReceiveFor stores a batch of received messages in one statement, one inbox
// row per message and target, each deduplicated by (handler, dedup key). A
// key already stored with a different payload is a conflict: recorded in
// inbox_conflicts and reported in the result; the stored event stands. A bad
// key strategy spec is reported naming targets[i].DedupKey.
func ReceiveFor(ctx context.Context, q DBTX, targets []Target, msgs []Incoming) (ReceiveResult, error) {
	return ReceiveWith(ctx, q, msgs, ReceiveOptions{Targets: targets})
}

// ReceiveOptions tunes ReceiveWith. The zero value is Receive's behaviour.
type ReceiveOptions struct {
	// Targets are the handlers rows are stored for. Default: the default
	// handler, keyed by event id.
	Targets []Target
	// NoDuplicateRecord skips recording duplicates in inbox_duplicates and
	// counting the batch in inbox_receive_counts (the console's dedup feed
	// and hit rate). Default false: both are written by the insert statement
	// itself, with the handler each duplicate was absorbed for.
	NoDuplicateRecord bool
}

func (o ReceiveOptions) parse() (receiveOptions, error) {
	ts, err := parseTargets("pgrelay: targets", o.Targets)
	return receiveOptions{targets: ts, noDuplicateRecord: o.NoDuplicateRecord}, err
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
func ReceiveWith(ctx context.Context, q DBTX, msgs []Incoming, opts ReceiveOptions) (ReceiveResult, error) {
	po, err := opts.parse()
	if err != nil {
		return ReceiveResult{}, err
	}
	res, _, err := receive(ctx, q, msgs, po, storedProcessed{})
	return res, err
}

// InboxEvent is a claimed inbox event, as a handler sees it.
type InboxEvent struct {
	Message
	// Handler is the name of the handler the event's inbox row belongs to.
	Handler string
	// DedupKey is the row's dedup key under the handler's key strategy (the
	// event id for the message-id strategy).
	DedupKey string
	// ReceivedAt is when the inbox stored the event.
	ReceivedAt time.Time
	// Attempts counts the attempts so far, this one included (1 on the first).
	Attempts int
	// Deferrals counts how often the event was deferred (see Defer).
	Deferrals int
	// LockVersion is the fencing version of this claim.
	LockVersion int64
	// LastError is the error recorded by the previous attempt, if any.
	LastError string

	heldBack bool // ordered mode: handed back out of order by this claim
}

// InboxHandler runs an event's side effect. It must do all its database work
// in tx: that transaction also records the event as processed, so the effect
// and the mark commit together or not at all. A nil error means success; any
// other error is retried with backoff, except Permanent errors (dead at once)
// and Defer (wait for a dependency). A panic is recovered and treated like a
// transient error. ctx expires after InboxConfig.HandlerTimeout. Events the
// handler enqueues in tx with ctx (Enqueue) record ev as their cause
// (HeaderCausationID, HeaderCorrelationID); they are published if and only if
// tx commits.
type InboxHandler interface {
	Handle(ctx context.Context, tx pgx.Tx, ev *InboxEvent) error
}

// InboxBatchHandler is an InboxHandler that can also apply a whole batch at
// once (HandleBatch), typically one set-based statement per kind of effect, in
// the transaction that marks the batch processed with one statement. If
// HandleBatch returns an error, the batch is rolled back and run again event
// by event through Handle, each event isolated, so it may refuse anything
// that needs a per-event decision. evs is in arrival order and must not be
// modified. ctx names no cause: to link events enqueued here to their input,
// use CausedBy per input.
type InboxBatchHandler interface {
	InboxHandler
	HandleBatch(ctx context.Context, tx pgx.Tx, evs []*InboxEvent) error
}

// ExternalHandler is an InboxHandler whose effect lies outside the database
// (a webhook call, an email, a payment provider's API), which rolling back
// the transaction does not undo; ExternalEffects reports whether that is so
// (a wrapper reports what it wraps). The worker normally runs a batch in one
// transaction and, when one event fails, rolls it back and runs the batch
// again event by event, which would repeat every external call that had
// already succeeded. For a handler whose ExternalEffects is true it commits
// each event in a transaction of its own instead, never applies it on
// receive and does not use HandleBatch, so a call that succeeded is never
// made again because another event failed. A crash, a lost connection or a
// failed commit between the call and the commit of its processed mark, or a
// takeover of an expired lease, still repeats the call: pass the event id to
// the remote side as its idempotency key. The cost is a commit per event.
type ExternalHandler interface {
	InboxHandler
	ExternalEffects() bool
}

// HandlerFunc adapts a function to InboxHandler. Return nil on success,
// Permanent(err) for input that can never succeed, Defer(key) to wait for a
// dependency, and any other error to retry with backoff.
type HandlerFunc func(ctx context.Context, tx pgx.Tx, ev *InboxEvent) error

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, tx pgx.Tx, ev *InboxEvent) error {
	return f(ctx, tx, ev)
}

// InboxObserver is told about every inbox state change, for metrics. Its
// methods are called from the worker goroutines concurrently and must not
// block. An observer that also implements SequenceObserver is told the
// sequence outcomes of ordered apply.
type InboxObserver interface {
	// Received reports one Receive call of a consumer: rows stored and
	// duplicates skipped.
	Received(inserted, duplicates int)
	// Claimed reports one claim: n events claimed, of which takeovers were
	// taken over from a worker whose lease expired.
	Claimed(n, takeovers int)
	// Processed reports an event whose handler committed, and how long it ran.
	Processed(ev *InboxEvent, d time.Duration)
	// Retried reports an event put back for another attempt.
	Retried(ev *InboxEvent, reason string)
	// Deferred reports an event put back to wait for a dependency.
	Deferred(ev *InboxEvent)
	// Dead reports an event moved to the dead letter state.
	Dead(ev *InboxEvent, reason string)
	// Fenced reports an event whose claim was lost to another worker before
	// this worker finished it: this worker's side effect was rolled back.
	Fenced(ev *InboxEvent)
}

// InboxRetentionObserver is told what the inbox's upkeep does, for metrics.
type InboxRetentionObserver interface {
	// Deleted reports the processed rows deleted by one run.
	Deleted(n int64)
	// Failed reports a failed run.
	Failed(err error)
}

// InboxConfig configures an InboxWorker. The zero value of every optional
// field means the default it documents.
type InboxConfig struct {
	// Pool is the database the inbox lives in (migrated). Required. Give it
	// at least Workers+2 connections.
	Pool *pgxpool.Pool
	// Handler runs each event's side effect; an InboxBatchHandler also
	// applies whole batches. Required.
	Handler InboxHandler
	// HandlerName names the handler: the worker claims only the inbox rows
	// stored for it (ReceiveFor's targets), so several handlers in one
	// database each process an event once, with their own status, attempts,
	// lease and dead letters. Default DefaultHandlerName ("default").
	HandlerName string
	// Logger receives the worker's logs. Default: none.
	Logger *slog.Logger
	// Observer is told about every state change, for metrics. Default: none.
	Observer InboxObserver
	// WorkerID is recorded as locked_by on claimed rows; at most 200 bytes.
	// Default: "hostname-pid-random".
	WorkerID string
	// Workers is how many batches run concurrently, each on its own
	// connection. Default DefaultWorkers (4); at most 1000.
	Workers int
	// BatchSize is the most events claimed and processed in one transaction.
	// Default DefaultBatchSize (50); at most MaxBatchSize.
	BatchSize int
	// Lease is how long a claim is exclusive; an event still processing after
	// it may be taken over by another worker, and this worker is then fenced.
	// Default DefaultLease (30s). Must exceed HandlerTimeout.
	Lease time.Duration
	// HandlerTimeout bounds one handler call. Default DefaultHandlerTimeout
	// (10s).
	HandlerTimeout time.Duration
	// MaxAttempts is the number of attempts before an event goes dead.
	// Default DefaultMaxAttempts (10).
	MaxAttempts int
	// BackoffMin is the wait after the first failed attempt; BackoffMax caps
	// the exponential backoff between attempts. Defaults 1s and 5m.
	BackoffMin, BackoffMax time.Duration
	// MaxDeferrals is how often one event may be deferred before it goes dead.
	// Default 20.
	MaxDeferrals int
	// DeferFallback is when a deferred event runs again if its dependency is
	// never released. Default 1m.
	DeferFallback time.Duration
	// PollInterval is the mean interval between polls for due events (jittered
	// ±50%), the fallback behind LISTEN/NOTIFY and for retries coming due.
	// Default DefaultPollInterval (1s).
	PollInterval time.Duration
	// ListenConnConfig, when set, is the connection LISTEN is dialled with
	// instead of Pool's settings: a direct connection to PostgreSQL when Pool
	// goes through a connection pooler in transaction mode (docs/pooler.md).
	// Default: Pool's.
	ListenConnConfig *pgx.ConnConfig
	// NoListen turns LISTEN/NOTIFY wake-ups off: events another process
	// stored are found at the next poll (PollInterval). For a Pool behind a
	// pooler in transaction mode, where LISTEN does not work, without
	// ListenConnConfig.
	NoListen bool
	// QueryTimeout bounds each inbox query outside handlers. Default 10s.
	QueryTimeout time.Duration
	// ShutdownTimeout is how long in-flight batches may run on after Run's
	// context is cancelled; then they are rolled back and their claims handed
	// back (pending, attempt refunded). Default 10s.
	ShutdownTimeout time.Duration
	// Retention is the inbox's upkeep, which Run runs beside the workers
	// unless Retention.Disabled.
	Retention InboxRetentionConfig
	// Ordered applies the events of one key strictly in their per-key
	// sequence (Message.KeySeq): a key's later event never runs while an
	// earlier one is unapplied (missing, retrying or dead); a sequence at or
	// below the last applied one is absorbed as a duplicate without running
	// the handler. Events without a sequence are applied unordered. Default
	// false. See ListWaiting.
	Ordered bool
	// GapTimeout is how long, in ordered mode, a key may wait for a missing
	// sequence before the gap is reported; the key keeps waiting until the
	// sequence arrives or an operator skips it. Default DefaultGapTimeout (5m).
	GapTimeout time.Duration
	// StatisticsInterval is how often Run checks whether the inbox's planner
	// statistics went stale and analyzes it then. Default 5s; negative:
	// never (leave it to autovacuum).
	StatisticsInterval time.Duration
}

// InboxRetentionConfig configures the inbox's upkeep (InboxConfig.Retention),
// which an inbox worker runs by default: processed rows are deleted after
// the dedup window, old Release records, key conflicts and the duplicate
// record are pruned. Dead rows are never deleted.
type InboxRetentionConfig struct {
	// Disabled leaves the upkeep to another process (one per database is
	// enough; more are harmless). Default false.
	Disabled bool
	// Window is how long a processed row is kept after it was processed (the
	// dedup window); recorded key conflicts are kept as long. Default
	// DefaultDedupWindow (7 days); at least MinDedupWindow (1h).
	Window time.Duration
	// ReleaseHorizon is how long Release records are kept. Default: ten
	// leases and at least 10m.
	ReleaseHorizon time.Duration
	// BatchSize is the most rows one DELETE removes; each batch is its own
	// short transaction. Default 1000; at most 100000.
	BatchSize int
	// DuplicatesMax is how many recorded duplicates (the operator console's
	// feed) each run keeps. Default 10000.
	DuplicatesMax int
	// Interval is the mean time between runs (jittered ±20%). Default 1m.
	Interval time.Duration
	// Pause is the wait between two batches of one run. Default 10ms.
	Pause time.Duration
	// QueryTimeout bounds each batch. Default 30s.
	QueryTimeout time.Duration
	// Observer is told how many rows each run deleted. Default: none.
	Observer InboxRetentionObserver
}
