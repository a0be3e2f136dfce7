// Package admin holds pgrelay's operator operations (statistics, dead-letter
// listing, requeue and purge, the replay audit trail, the console's reads).
// The HTTP API (adminhttp), the subcommands (admincli) and the console call
// the same Service methods, so they behave identically.
package admin

import (
	"cmp"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/internal/db"
	"github.com/pgrelay/pgrelay/internal/event"
)

// Source names the table a dead letter lives in.
type Source string

// The sources of dead letters.
const (
	SourceInbox  Source = "inbox"
	SourceOutbox Source = "outbox"
)

// Errors returned by Service methods. The HTTP API maps them onto status codes.
var (
	// ErrNotFound is returned when no event has the requested id.
	ErrNotFound = errors.New("admin: event not found")
	// ErrInvalid wraps every error caused by a bad request.
	ErrInvalid = errors.New("admin: invalid request")
	// ErrUnsupported is returned for operations on a source whose schema is
	// not installed.
	ErrUnsupported = errors.New("admin: not supported")
)

// Config configures a Service.
type Config struct {
	// Pool is the database the operations run against. Required.
	Pool *pgxpool.Pool
	// Database names it where a process serves several (a relay's
	// database): a dry run's confirmation is bound to it. Default: "".
	Database string
	// Logger receives one line per changing operation. Default: a no-op logger.
	Logger *slog.Logger
	// QueryTimeout bounds each operation's database work. Default: 30s.
	QueryTimeout time.Duration
	// MaxRows caps how many events one list, requeue or purge touches; a
	// request may ask for fewer. Default: 1000.
	MaxRows int
	// Counters, when set, returns the process's delivery counters (messages
	// received from the broker, and how many of them were duplicates), from
	// which Stats derives the dedup hit rate. The database does not record
	// duplicates, so without it the rate is omitted. Default: nil.
	Counters func() (received, duplicates float64, ok bool)
	// Now returns the current time, from which the CLI turns relative
	// --since and --until values into times. Purge cut-offs (older_than) use
	// the database's clock instead; it also dates dry runs' confirmations.
	// Default: time.Now.
	Now func() time.Time
	// ConfirmTTL is how long a dry run's confirmation (Result.Confirm) can
	// be used. Default: DefaultConfirmTTL.
	ConfirmTTL time.Duration
}

// WithDefaults returns a copy of c with every unset field at its default.
func (c Config) WithDefaults() Config {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.QueryTimeout == 0 {
		c.QueryTimeout = 30 * time.Second
	}
	if c.MaxRows == 0 {
		c.MaxRows = 1000
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.ConfirmTTL == 0 {
		c.ConfirmTTL = DefaultConfirmTTL
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.Pool == nil:
		return errors.New("admin: Config.Pool is required")
	case c.ConfirmTTL < 0:
		return fmt.Errorf("admin: Config.ConfirmTTL must be positive, got %s", c.ConfirmTTL)
	case c.QueryTimeout < 0:
		return fmt.Errorf("admin: Config.QueryTimeout must be positive, got %s", c.QueryTimeout)
	case c.MaxRows < 0 || c.MaxRows > math.MaxInt32:
		return fmt.Errorf("admin: Config.MaxRows must be between 1 and %d, got %d", math.MaxInt32, c.MaxRows)
	}
	return nil
}

// Service runs the operator operations. It is safe for concurrent use.
type Service struct {
	cfg Config
	q   *db.Queries
}

// New returns a Service.
func New(cfg Config) (*Service, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Service{cfg: cfg, q: db.New()}, nil
}

// Filter selects dead letters. Every field is optional; the zero Filter
// matches every dead letter.
type Filter struct {
	// Handler matches the rows of one named handler (inbox only; each
	// handler keeps its own dead letters).
	Handler string `json:"handler,omitempty"`
	// EventID matches one event.
	EventID string `json:"event_id,omitempty"`
	// Topic matches the topic exactly.
	Topic string `json:"topic,omitempty"`
	// EventType matches the event type exactly.
	EventType string `json:"event_type,omitempty"`
	// Key matches the event's key (the broker's partition or ordering key)
	// exactly.
	Key string `json:"key,omitempty"`
	// ErrorContains matches a substring of the recorded error, ignoring case.
	ErrorContains string `json:"error_contains,omitempty"`
	// DeadAfter matches events that went dead at or after this time.
	DeadAfter *time.Time `json:"dead_after,omitempty"`
	// DeadBefore matches events that went dead before this time.
	DeadBefore *time.Time `json:"dead_before,omitempty"`
	// Limit caps the number of events returned or touched; 0 means
	// Config.MaxRows, and larger values are capped at it.
	Limit int `json:"limit,omitempty"`
}

// IsEmpty reports whether f selects every dead letter.
func (f Filter) IsEmpty() bool {
	return f.Handler == "" && f.EventID == "" && f.Topic == "" && f.EventType == "" && f.Key == "" && f.ErrorContains == "" &&
		f.DeadAfter == nil && f.DeadBefore == nil
}

func (f Filter) validate(src Source) error {
	if src == SourceOutbox && f.Handler != "" {
		return fmt.Errorf("%w: handler applies to inbox rows only", ErrInvalid)
	}
	if f.Limit < 0 {
		return fmt.Errorf("%w: limit must not be negative, got %d", ErrInvalid, f.Limit)
	}
	if f.DeadAfter != nil && f.DeadBefore != nil && !f.DeadAfter.Before(*f.DeadBefore) {
		return fmt.Errorf("%w: dead_after (%s) must be before dead_before (%s)", ErrInvalid,
			f.DeadAfter.Format(time.RFC3339), f.DeadBefore.Format(time.RFC3339))
	}
	return nil
}

func (s *Service) limit(f Filter) int32 {
	if f.Limit > 0 && f.Limit < s.cfg.MaxRows {
		return int32(f.Limit)
	}
	return int32(s.cfg.MaxRows)
}

// DeadLetter is one dead (or, from Show, any) event.
type DeadLetter struct {
	Source Source `json:"source"`
	// Handler, DedupKey and KeyStrategy identify an inbox row: the named
	// handler it belongs to and its key under the handler's strategy.
	Handler     string `json:"handler,omitempty"`
	DedupKey    string `json:"dedup_key,omitempty"`
	KeyStrategy string `json:"key_strategy,omitempty"`
	// OtherHandlers (Show) names the other handlers that hold a row for the
	// same event id.
	OtherHandlers []string `json:"other_handlers,omitempty"`
	EventID       string   `json:"event_id"`
	Status        string   `json:"status"`
	Topic         string   `json:"topic"`
	Key           string   `json:"key"`
	EventType     string   `json:"event_type"`
	Attempts      int32    `json:"attempts"`
	// ReceivedAt is when the inbox stored the event (inbox only).
	ReceivedAt *time.Time `json:"received_at,omitempty"`
	// CreatedAt is when the outbox row was committed (outbox only).
	CreatedAt *time.Time `json:"created_at,omitempty"`
	// DeadAt is when the event went dead (for Show of a processed inbox
	// event: when it was processed; of a published outbox row: when it was
	// published).
	DeadAt    *time.Time `json:"dead_at,omitempty"`
	LastError string     `json:"last_error,omitempty"`
	// ID and Partition are the outbox row's id and relay partition.
	ID        int64 `json:"id,omitempty"`
	Partition int32 `json:"partition,omitempty"`
	// The fields below are filled by Show only.

	OccurredAt *time.Time        `json:"occurred_at,omitempty"`
	Headers    map[string]string `json:"headers,omitempty"`
	// Payload is the body as text when it is valid UTF-8, else base64
	// (PayloadEncoding says which).
	Payload         string `json:"payload,omitempty"`
	PayloadEncoding string `json:"payload_encoding,omitempty"`
	LockVersion     int64  `json:"lock_version,omitempty"`
	Deferrals       int32  `json:"deferrals,omitempty"`
	WaitingFor      string `json:"waiting_for,omitempty"`
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func narg(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func (s *Service) checkSource(src Source) error {
	switch src {
	case SourceInbox:
		return nil
	case SourceOutbox:
		return nil
	default:
		return fmt.Errorf("%w: unknown source %q: want inbox or outbox", ErrInvalid, src)
	}
}

// ListDead returns the dead letters f selects, oldest first.
func (s *Service) ListDead(ctx context.Context, src Source, f Filter) ([]DeadLetter, error) {
	if err := s.checkSource(src); err != nil {
		return nil, err
	}
	if err := f.validate(src); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	out, err := s.listDead(ctx, s.cfg.Pool, src, f)
	if err != nil {
		return nil, fmt.Errorf("admin: list dead %s events: %w", src, err)
	}
	return out, nil
}

// listDead runs the one dead-letter filter of src on q (the pool, or the
// transaction of a requeue or purge), oldest first, at most s.limit(f).
func (s *Service) listDead(ctx context.Context, q db.DBTX, src Source, f Filter) ([]DeadLetter, error) {
	if src == SourceOutbox {
		return s.listOutboxDead(ctx, q, f)
	}
	rows, err := s.q.AdminListInboxDead(ctx, q, db.AdminListInboxDeadParams{
		Handler: narg(f.Handler), EventID: narg(f.EventID), Topic: narg(f.Topic), EventType: narg(f.EventType), Key: narg(f.Key),
		ErrorContains: narg(f.ErrorContains), DeadAfter: f.DeadAfter, DeadBefore: f.DeadBefore,
		MaxRows: s.limit(f),
	})
	if err != nil {
		return nil, err
	}
	out := make([]DeadLetter, 0, len(rows))
	for _, r := range rows {
		out = append(out, DeadLetter{
			Source: src, Handler: r.Handler, DedupKey: r.DedupKey, EventID: r.EventID, Status: "dead", Topic: r.Topic, Key: r.Key,
			EventType: r.EventType, Attempts: r.Attempts, ReceivedAt: &r.ReceivedAt,
			DeadAt: r.FinishedAt, LastError: deref(r.LastError),
		})
	}
	return out, nil
}

// Show returns one event, whatever its status, with its payload and headers.
// An inbox event has a row per handler that stored it: handler picks one;
// without it the first by name is shown and OtherHandlers lists the rest.
func (s *Service) Show(ctx context.Context, src Source, eventID, handler string) (*DeadLetter, error) {
	if err := s.checkSource(src); err != nil {
		return nil, err
	}
	if eventID == "" {
		return nil, fmt.Errorf("%w: an event id is required", ErrInvalid)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	if src == SourceOutbox {
		return s.showOutbox(ctx, eventID)
	}
	rows, err := s.q.AdminGetInboxEvent(ctx, s.cfg.Pool, db.AdminGetInboxEventParams{EventID: eventID, Handler: narg(handler)})
	if err != nil {
		return nil, fmt.Errorf("admin: show %s event %q: %w", src, eventID, err)
	}
	if len(rows) == 0 {
		if handler != "" {
			return nil, fmt.Errorf("%w: %s event %q of handler %q", ErrNotFound, src, eventID, handler)
		}
		return nil, fmt.Errorf("%w: %s event %q", ErrNotFound, src, eventID)
	}
	r := rows[0]
	d := &DeadLetter{
		Source: src, Handler: r.Handler, DedupKey: r.DedupKey, KeyStrategy: r.KeyStrategy, EventID: r.EventID, Status: r.Status, Topic: r.Topic, Key: r.Key,
		EventType: r.EventType, Attempts: r.Attempts, ReceivedAt: &r.ReceivedAt,
		LastError: deref(r.LastError), OccurredAt: &r.OccurredAt, LockVersion: r.LockVersion,
		Deferrals: r.Deferrals, WaitingFor: deref(r.WaitingFor),
	}
	if r.Status == "dead" || r.Status == "processed" {
		d.DeadAt = r.FinishedAt
	}
	for _, o := range rows[1:] {
		d.OtherHandlers = append(d.OtherHandlers, o.Handler)
	}
	d.Payload, d.PayloadEncoding = encodePayload(r.Payload)
	d.Headers = decodeHeaders(r.Headers)
	return d, nil
}

// RequeueRequest asks for dead letters to go back to pending.
type RequeueRequest struct {
	// Filter selects the dead letters. An empty filter is refused unless All
	// is set.
	Filter Filter `json:"filter"`
	// All confirms that an empty Filter means every dead letter (up to the
	// limit).
	All bool `json:"all,omitempty"`
	// Actor names who asks (a person or system). Required; it is recorded in
	// the audit table.
	Actor string `json:"actor"`
	// Reason says why. Required; it is recorded in the audit table.
	Reason string `json:"reason"`
	// DryRun runs the operation and rolls it back: the result shows exactly
	// what would change, and nothing does.
	DryRun bool `json:"dry_run,omitempty"`
	// Confirm is the confirmation a dry run of this request returned: the
	// request then acts only on exactly the events that dry run showed, and
	// changes nothing (ErrStale) when they changed or it expired.
	Confirm string `json:"confirm,omitempty"`
}

// PurgeRequest asks for dead letters to be deleted.
type PurgeRequest struct {
	// Filter selects the dead letters, further narrowed by OlderThan.
	Filter Filter `json:"filter"`
	// OlderThan restricts the purge to events dead for at least this long.
	// Required (zero means "dead before now").
	OlderThan *time.Duration `json:"older_than"`
	// Actor names who asks. Required; it is recorded in the audit table.
	Actor string `json:"actor"`
	// Reason says why. Optional; it is recorded in the audit table.
	Reason string `json:"reason,omitempty"`
	// DryRun runs the operation and rolls it back.
	DryRun bool `json:"dry_run,omitempty"`
	// Confirm is the confirmation a dry run of this request returned (see
	// RequeueRequest.Confirm).
	Confirm string `json:"confirm,omitempty"`
}

// Affected is one event a requeue or purge touched.
type Affected struct {
	EventID string `json:"event_id"`
	// Handler is the inbox row's handler (inbox only).
	Handler          string    `json:"handler,omitempty"`
	AuditID          int64     `json:"audit_id,omitempty"`
	At               time.Time `json:"at"`
	PreviousAttempts int32     `json:"previous_attempts"`
	PreviousError    string    `json:"previous_error,omitempty"`
}

// Result reports a requeue or purge.
type Result struct {
	Source Source `json:"source"`
	Action string `json:"action"`
	DryRun bool   `json:"dry_run"`
	// Count is how many events were (or, in a dry run, would be) touched.
	Count int `json:"count"`
	// Limit is the cap that applied; when Count equals it, more events may
	// match and the operation can be repeated.
	Limit  int        `json:"limit"`
	More   bool       `json:"more"`
	Events []Affected `json:"events"`
	// Confirm (a dry run that selected events) binds a run to exactly these
	// events: send the same request with it as Confirm before
	// ConfirmExpires.
	Confirm        string     `json:"confirm,omitempty"`
	ConfirmExpires *time.Time `json:"confirm_expires_at,omitempty"`
}

func validateActor(actor, reason string, reasonRequired bool) error {
	switch {
	case actor == "":
		return fmt.Errorf("%w: actor is required (who asks; it is recorded in the audit table)", ErrInvalid)
	case !utf8.ValidString(actor) || len(actor) > 200:
		return fmt.Errorf("%w: actor must be valid UTF-8 of at most 200 bytes", ErrInvalid)
	case reasonRequired && reason == "":
		return fmt.Errorf("%w: reason is required (why; it is recorded in the audit table)", ErrInvalid)
	case !utf8.ValidString(reason) || len(reason) > 2000:
		return fmt.Errorf("%w: reason must be valid UTF-8 of at most 2000 bytes", ErrInvalid)
	}
	return nil
}

// Requeue moves the selected dead letters back to pending with the same
// event id, attempts reset, and records each one in the replay audit table
// (who, when, why, and the error it had), all in one transaction. Inbox
// workers (or relays) are woken so the events are picked up at once. A
// requeued outbox row keeps its id, so the relay publishes it before any
// pending row of its partition: it is, by nature, out of order with the
// events of its key published since it went dead.
func (s *Service) Requeue(ctx context.Context, src Source, req RequeueRequest) (*Result, error) {
	if err := s.checkSource(src); err != nil {
		return nil, err
	}
	if err := req.Filter.validate(src); err != nil {
		return nil, err
	}
	if err := validateActor(req.Actor, req.Reason, true); err != nil {
		return nil, err
	}
	if req.Filter.IsEmpty() && !req.All {
		return nil, fmt.Errorf("%w: refusing to requeue every dead letter without a filter; give an event id or a filter, or set all", ErrInvalid)
	}
	res := &Result{Source: src, Action: "requeue", DryRun: req.DryRun, Limit: int(s.limit(req.Filter)), Events: []Affected{}}
	confirm, err := parseConfirm(req.Confirm, s.cfg.Now())
	if err != nil {
		return nil, err
	}
	err = s.inTx(ctx, req.DryRun, func(ctx context.Context, tx pgx.Tx) error {
		picked, err := s.applyToDead(ctx, tx, src, req.Filter, res, req.Actor, req.Reason, confirm, func(k deadKeys) ([]db.ReplayAudit, error) {
			if src == SourceOutbox {
				audits, err := s.q.AdminRequeueOutboxDead(ctx, tx, db.AdminRequeueOutboxDeadParams{Actor: req.Actor, Reason: req.Reason, Ids: k.ids})
				return audits, s.explainTopicRefusal(ctx, k.ids, err)
			}
			return s.q.AdminRequeueInboxDead(ctx, tx, db.AdminRequeueInboxDeadParams{Actor: req.Actor, Reason: req.Reason,
				Handlers: k.handlers, DedupKeys: k.dedupKeys})
		})
		if err != nil || len(res.Events) == 0 {
			return err
		}
		return s.wake(ctx, tx, src, picked)
	})
	if err != nil {
		return nil, fmt.Errorf("admin: requeue dead %s events: %w", src, err)
	}
	s.finish(res, req.Actor, req.Reason)
	return res, nil
}

// explainTopicRefusal turns a requeue that the outbox_topic_valid
// constraint refused (a dead row stored before migration 00095 with a topic
// the outbox no longer accepts) into a bad request naming those events and
// what to do; any other error is returned as it is.
func (s *Service) explainTopicRefusal(ctx context.Context, ids []int64, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23514" || pgErr.ConstraintName != "outbox_topic_valid" {
		return err
	}
	// The transaction is aborted: read the committed rows on the pool.
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.QueryTimeout)
	defer cancel()
	var bad []string
	rows, lerr := s.q.AdminOutboxTopics(qctx, s.cfg.Pool, ids)
	for _, r := range rows {
		if !event.ValidTopic(r.Topic) && len(bad) < 5 {
			bad = append(bad, fmt.Sprintf("%s (topic %q)", r.EventID, r.Topic))
		}
	}
	if lerr != nil || len(bad) == 0 {
		bad = []string{"some of them"}
	}
	return fmt.Errorf("%w: nothing was requeued: the outbox no longer accepts the topic of dead events %s (constraint outbox_topic_valid, migration 00095: letters, digits, '-', '_' and '.' between non-empty parts); they can never be published: purge them, or leave them out of the requeue: %w",
		ErrInvalid, strings.Join(bad, ", "), err)
}

// Purge deletes the selected dead letters that have been dead for at least
// OlderThan, and records each one in the replay audit table, in one
// transaction. A purged inbox event no longer deduplicates: a later
// redelivery of the same event id is received as new.
func (s *Service) Purge(ctx context.Context, src Source, req PurgeRequest) (*Result, error) {
	if err := s.checkSource(src); err != nil {
		return nil, err
	}
	if err := req.Filter.validate(src); err != nil {
		return nil, err
	}
	if err := validateActor(req.Actor, req.Reason, false); err != nil {
		return nil, err
	}
	if req.OlderThan == nil {
		return nil, fmt.Errorf("%w: older_than is required (for example 720h; 0s purges every match)", ErrInvalid)
	}
	if *req.OlderThan < 0 {
		return nil, fmt.Errorf("%w: older_than must not be negative, got %s", ErrInvalid, *req.OlderThan)
	}
	f := req.Filter
	res := &Result{Source: src, Action: "purge", DryRun: req.DryRun, Limit: int(s.limit(f)), Events: []Affected{}}
	confirm, err := parseConfirm(req.Confirm, s.cfg.Now())
	if err != nil {
		return nil, err
	}
	err = s.inTx(ctx, req.DryRun, func(ctx context.Context, tx pgx.Tx) error {
		// The cut-off is measured with the database's clock, which wrote the
		// times it is compared with: a client whose clock runs fast must not
		// purge younger dead letters.
		now, err := s.q.AdminNow(ctx, tx)
		if err != nil {
			return err
		}
		cutoff := now.Add(-*req.OlderThan)
		if f.DeadBefore == nil || cutoff.Before(*f.DeadBefore) {
			f.DeadBefore = &cutoff
		}
		_, err = s.applyToDead(ctx, tx, src, f, res, req.Actor, req.Reason, confirm, func(k deadKeys) ([]db.ReplayAudit, error) {
			if src == SourceOutbox {
				return s.q.AdminPurgeOutboxDead(ctx, tx, db.AdminPurgeOutboxDeadParams{Actor: req.Actor, Reason: req.Reason, Ids: k.ids})
			}
			return s.q.AdminPurgeInboxDead(ctx, tx, db.AdminPurgeInboxDeadParams{Actor: req.Actor, Reason: req.Reason,
				Handlers: k.handlers, DedupKeys: k.dedupKeys})
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("admin: purge dead %s events: %w", src, err)
	}
	s.finish(res, req.Actor, req.Reason)
	return res, nil
}

// deadKeys are the keys of the dead letters a requeue or purge acts on: an
// inbox row's handler and dedup key, an outbox row's id.
type deadKeys struct {
	handlers, dedupKeys []string
	ids                 []int64
}

// applyToDead runs the dead-letter filter f of src in tx and hands the keys
// of the rows it selected to act, which requeues or purges those still dead
// and returns their audit rows. They fill res.Events, in the filter's order
// (oldest first). A confirmation refuses a selection other than the one it
// reviewed; a dry run that selects events issues one. It returns the
// selected dead letters.
func (s *Service) applyToDead(ctx context.Context, tx pgx.Tx, src Source, f Filter, res *Result, actor, reason string,
	confirm *parsedConfirm, act func(deadKeys) ([]db.ReplayAudit, error)) ([]DeadLetter, error) {
	picked, err := s.listDead(ctx, tx, src, f)
	if err != nil {
		return nil, err
	}
	if err := confirm.check(s.cfg.Database, res.Action, src, actor, reason, picked); err != nil {
		return nil, err
	}
	if len(picked) == 0 {
		return picked, nil
	}
	if res.DryRun {
		expires := s.cfg.Now().Add(s.cfg.ConfirmTTL).Truncate(time.Second)
		res.Confirm = confirmToken(s.cfg.Database, res.Action, src, actor, reason, picked, expires)
		res.ConfirmExpires = &expires
	}
	var k deadKeys
	order := make(map[string]int, len(picked))
	for i, d := range picked {
		if src == SourceOutbox {
			k.ids = append(k.ids, d.ID)
		} else {
			k.handlers = append(k.handlers, d.Handler)
			k.dedupKeys = append(k.dedupKeys, d.DedupKey)
		}
		order[d.Handler+"\x00"+d.EventID] = i
	}
	rows, err := act(k)
	if err != nil {
		return nil, err
	}
	for _, r := range rows {
		res.Events = append(res.Events, Affected{EventID: r.EventID, Handler: deref(r.Handler), AuditID: r.ID, At: r.At,
			PreviousAttempts: r.PreviousAttempts, PreviousError: deref(r.PreviousError)})
	}
	slices.SortStableFunc(res.Events, func(a, b Affected) int {
		return cmp.Compare(order[a.Handler+"\x00"+a.EventID], order[b.Handler+"\x00"+b.EventID])
	})
	return picked, nil
}

// wake tells the workers of src that requeued dead letters are pending: the
// inbox workers, or the relays of the requeued outbox rows' partitions.
func (s *Service) wake(ctx context.Context, tx pgx.Tx, src Source, requeued []DeadLetter) error {
	if src == SourceInbox {
		return s.q.AdminNotifyInbox(ctx, tx)
	}
	var partitions []int32
	for _, d := range requeued {
		if !slices.Contains(partitions, d.Partition) {
			partitions = append(partitions, d.Partition)
		}
	}
	return s.q.AdminNotifyOutbox(ctx, tx, partitions)
}

func (s *Service) finish(res *Result, actor, reason string) {
	res.Count = len(res.Events)
	res.More = res.Count >= res.Limit
	if res.DryRun {
		// The audit rows were rolled back with everything else.
		for i := range res.Events {
			res.Events[i].AuditID = 0
		}
		return
	}
	s.cfg.Logger.Info("dead letters "+res.Action+"d",
		slog.String("source", string(res.Source)), slog.Int("count", res.Count),
		slog.String("actor", actor), slog.String("reason", reason))
}

// inTx runs f in a transaction that commits, or rolls back when dryRun is set.
func (s *Service) inTx(ctx context.Context, dryRun bool, f func(context.Context, pgx.Tx) error) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	tx, err := s.cfg.Pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	if err := f(ctx, tx); err != nil {
		return err
	}
	if dryRun {
		return tx.Rollback(ctx)
	}
	return tx.Commit(ctx)
}

// AuditEntry is one row of the replay audit table.
type AuditEntry struct {
	ID               int64     `json:"id"`
	At               time.Time `json:"at"`
	Source           string    `json:"source"`
	Action           string    `json:"action"`
	EventID          string    `json:"event_id"`
	Handler          string    `json:"handler,omitempty"`
	Actor            string    `json:"actor"`
	Reason           string    `json:"reason"`
	PreviousAttempts int32     `json:"previous_attempts"`
	PreviousError    string    `json:"previous_error,omitempty"`
}

// Audit returns the most recent audit entries, newest first, optionally for
// one event id and one source.
func (s *Service) Audit(ctx context.Context, eventID string, src Source, limit int) ([]AuditEntry, error) {
	if src != "" && src != SourceInbox && src != SourceOutbox {
		return nil, fmt.Errorf("%w: unknown source %q: want inbox or outbox", ErrInvalid, src)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	rows, err := s.q.AdminListReplayAudit(ctx, s.cfg.Pool, db.AdminListReplayAuditParams{
		EventID: narg(eventID), Source: narg(string(src)), MaxRows: s.limit(Filter{Limit: limit}),
	})
	if err != nil {
		return nil, fmt.Errorf("admin: list audit: %w", err)
	}
	out := make([]AuditEntry, 0, len(rows))
	for _, r := range rows {
		out = append(out, AuditEntry{ID: r.ID, At: r.At, Source: r.Source, Action: r.Action,
			EventID: r.EventID, Handler: r.Handler, Actor: r.Actor, Reason: r.Reason,
			PreviousAttempts: r.PreviousAttempts, PreviousError: deref(r.PreviousError)})
	}
	return out, nil
}

// Conflict is a delivery whose dedup key was already stored for its handler
// with a different payload fingerprint: same key, different content. The
// stored event's effect stands; the conflicting delivery was not processed.
type Conflict struct {
	ID          int64     `json:"id"`
	DetectedAt  time.Time `json:"detected_at"`
	Handler     string    `json:"handler"`
	DedupKey    string    `json:"dedup_key"`
	KeyStrategy string    `json:"key_strategy"`
	// StoredEventID is the event whose row holds the key (its effect stands);
	// EventID is the conflicting delivery's.
	StoredEventID     string `json:"stored_event_id"`
	EventID           string `json:"event_id"`
	StoredFingerprint string `json:"stored_fingerprint"`
	Fingerprint       string `json:"fingerprint"`
	Topic             string `json:"topic,omitempty"`
	EventType         string `json:"event_type,omitempty"`
	// Payload is the conflicting delivery's body (text when valid UTF-8,
	// else base64; PayloadEncoding says which).
	Payload         string `json:"payload,omitempty"`
	PayloadEncoding string `json:"payload_encoding,omitempty"`
}

// ListConflicts returns the recorded key conflicts, newest first, optionally
// of one handler and involving one event id (either side).
func (s *Service) ListConflicts(ctx context.Context, handler, eventID string, limit int) ([]Conflict, error) {
	if limit < 0 {
		return nil, fmt.Errorf("%w: limit must not be negative, got %d", ErrInvalid, limit)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	rows, err := s.q.AdminListInboxConflicts(ctx, s.cfg.Pool, db.AdminListInboxConflictsParams{
		Handler: narg(handler), EventID: narg(eventID), MaxRows: s.limit(Filter{Limit: limit}),
	})
	if err != nil {
		return nil, fmt.Errorf("admin: list key conflicts: %w", err)
	}
	out := make([]Conflict, 0, len(rows))
	for _, r := range rows {
		c := Conflict{ID: r.ID, DetectedAt: r.DetectedAt, Handler: r.Handler, DedupKey: r.DedupKey,
			KeyStrategy: r.KeyStrategy, StoredEventID: r.StoredEventID, EventID: r.EventID,
			StoredFingerprint: hex.EncodeToString(r.StoredFingerprint), Fingerprint: hex.EncodeToString(r.Fingerprint),
			Topic: r.Topic, EventType: r.EventType}
		c.Payload, c.PayloadEncoding = encodePayload(r.Payload)
		out = append(out, c)
	}
	return out, nil
}
