package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/internal/db"
	"github.com/pgrelay/pgrelay/internal/logbridge"
	"github.com/pgrelay/pgrelay/internal/setting"
)

// ErrNoSubscriptions is the transient failure of a batch published while
// the target database has no subscription at all: no consumer ever
// registered there. The relay retries it, so that the events wait in the
// outbox until one does.
var ErrNoSubscriptions = errors.New("no handler is registered in the target database's pgrelay.inbox_subscriptions yet " +
	"(start its consumer with --broker postgres, or call postgres.Register)")

// Publisher stores batches of events in the target database's inbox.
type Publisher struct {
	cfg  Config
	pool *pgxpool.Pool
	own  bool
	log  *slog.Logger
}

var _ broker.Publisher = (*Publisher)(nil)

// NewPublisher checks cfg, connects to the target database and checks that
// it has the inbox and its subscriptions table (pgrelay's migrations).
// Errors name the setting to fix.
func NewPublisher(ctx context.Context, cfg Config) (*Publisher, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p := &Publisher{cfg: cfg, pool: cfg.Pool, log: logbridge.Or(cfg.Logger).With(slog.String("logger", "postgres"))}
	if p.pool == nil {
		pc, err := pgxpool.ParseConfig(cfg.URL)
		if err != nil {
			return nil, setting.Errorf("", "postgres.Config", "URL", "{} %s: %v", RedactURL(cfg.URL), err)
		}
		pc.MaxConns = cfg.MaxConns
		if p.pool, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
			return nil, setting.Errorf("", "postgres.Config", "URL", "{} %s: %v", RedactURL(cfg.URL), err)
		}
		p.own = true
	}
	if err := p.checkTarget(ctx); err != nil {
		p.Close() //nolint:errcheck
		return nil, err
	}
	return p, nil
}

// checkTarget fails unless the target database can be reached and holds
// pgrelay's inbox and inbox_subscriptions.
func (p *Publisher) checkTarget(ctx context.Context) error {
	field := "URL"
	if p.cfg.Pool != nil {
		field = "Pool"
	}
	var inboxOK, subsOK bool
	err := p.pool.QueryRow(ctx, `SELECT pg_catalog.to_regclass('pgrelay.inbox') IS NOT NULL, pg_catalog.to_regclass('pgrelay.inbox_subscriptions') IS NOT NULL`).
		Scan(&inboxOK, &subsOK)
	if err != nil {
		return setting.Errorf("", "postgres.Config", field, "{}: cannot reach the target database: %w", err)
	}
	if !inboxOK || !subsOK {
		return setting.Errorf("", "postgres.Config", field, "{}: the target database lacks pgrelay's migrations (pgrelay.inbox, pgrelay.inbox_subscriptions): run `relay migrate up` against it")
	}
	return nil
}

// Healthy reports whether the target database answers.
func (p *Publisher) Healthy(ctx context.Context) error { return p.pool.Ping(ctx) }

// Close closes the connections the publisher opened (not Config.Pool).
func (p *Publisher) Close() error {
	if p.own {
		p.pool.Close()
	}
	return nil
}

// Publish stores msgs in the target's inbox, for every subscribed handler
// whose topics include each message's, in one transaction, and wakes the
// target's inbox workers (NOTIFY pgrelay_inbox) when it commits. A message
// the inbox already holds for every handler is reported as Duplicate. A
// message that can never be stored fails alone and permanently: a payload
// over Config.MaxMessageBytes, a field the inbox cannot hold (NUL bytes,
// invalid UTF-8), a topic no registered handler takes. Anything else (the
// database unreachable, no handler registered at all) fails every other
// message of the batch transiently: the transaction stored none of them.
func (p *Publisher) Publish(ctx context.Context, msgs []pgrelay.Message) []broker.Result {
	res := make([]broker.Result, len(msgs))
	todo := make([]int, 0, len(msgs))
	for i, m := range msgs {
		if len(m.Payload) > p.cfg.MaxMessageBytes {
			res[i].Err = broker.Terminalf("payload of %d bytes exceeds postgres.Config.MaxMessageBytes (%d)", len(m.Payload), p.cfg.MaxMessageBytes)
			continue
		}
		if err := (pgrelay.Incoming{Message: m}).Validate(); err != nil {
			res[i].Err = broker.Terminalf("the inbox cannot store it: %v", err)
			continue
		}
		todo = append(todo, i)
	}
	for len(todo) > 0 {
		err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error { return p.store(ctx, tx, msgs, todo, res) })
		if err == nil {
			return res
		}
		for _, i := range todo {
			res[i].Duplicate = false
		}
		// A message the inbox refuses although it passed the checks fails
		// alone; the others are stored again without it.
		if bad := (*refusedError)(nil); errors.As(err, &bad) {
			res[bad.index].Err = broker.Terminalf("the inbox cannot store it: %v", bad.err)
			todo = remove(todo, bad.index)
			continue
		}
		err = fmt.Errorf("postgres: store %d messages: %w", len(todo), err)
		for _, i := range todo {
			if res[i].Err == nil || !broker.IsTerminal(res[i].Err) {
				res[i].Err = err
			}
		}
		return res
	}
	return res
}

func remove(s []int, v int) []int {
	out := s[:0:0]
	for _, x := range s {
		if x != v {
			out = append(out, x)
		}
	}
	return out
}

// refusedError is a message ReceiveWith refused (*pgrelay.InvalidMessageError),
// by its index in the published batch.
type refusedError struct {
	index int
	err   error
}

func (e *refusedError) Error() string { return e.err.Error() }

// group is the messages stored for one set of targets.
type group struct {
	targets []pgrelay.Target
	idx     []int
}

// store stores msgs[todo] in tx, setting res[i].Duplicate for the messages
// every handler already held and a permanent error for those no handler
// takes.
func (p *Publisher) store(ctx context.Context, tx pgx.Tx, msgs []pgrelay.Message, todo []int, res []broker.Result) error {
	subs, err := Registered(ctx, tx)
	if err != nil {
		return err
	}
	if len(subs) == 0 {
		return ErrNoSubscriptions
	}
	type sub struct {
		t      pgrelay.Target
		topics map[string]bool
	}
	parsed := make([]sub, len(subs))
	for i, s := range subs {
		t, topics, err := s.target()
		if err != nil {
			return fmt.Errorf("pgrelay.inbox_subscriptions: %w", err)
		}
		parsed[i] = sub{t, topics}
	}
	// Usually every handler takes every topic: one group, one statement.
	groups := map[string]*group{}
	var order []string
	for _, i := range todo {
		var names []string
		var targets []pgrelay.Target
		for _, s := range parsed {
			if s.topics == nil || s.topics[msgs[i].Topic] {
				names = append(names, s.t.Handler)
				targets = append(targets, s.t)
			}
		}
		if len(targets) == 0 {
			res[i].Err = broker.Terminalf("no handler registered in the target database takes topic %q (pgrelay.inbox_subscriptions)", msgs[i].Topic)
			continue
		}
		k := strings.Join(names, "\x00")
		g, ok := groups[k]
		if !ok {
			g = &group{targets: targets}
			groups[k] = g
			order = append(order, k)
		}
		g.idx = append(g.idx, i)
	}
	stored := false
	for _, k := range order {
		g := groups[k]
		in := make([]pgrelay.Incoming, len(g.idx))
		for j, i := range g.idx {
			in[j] = pgrelay.Incoming{Message: msgs[i]}
		}
		rr, err := pgrelay.ReceiveWith(ctx, tx, in, pgrelay.ReceiveOptions{Targets: g.targets})
		if err != nil {
			if bad := (*pgrelay.InvalidMessageError)(nil); errors.As(err, &bad) {
				return &refusedError{index: g.idx[bad.Index], err: bad.Err}
			}
			return err
		}
		dup := make(map[string]int, len(rr.Duplicates))
		for _, id := range rr.Duplicates {
			dup[id]++
		}
		// Duplicates lists an event id once per message absorbed by every
		// handler: of copies repeated in the batch, the later ones.
		for j := len(g.idx) - 1; j >= 0; j-- {
			i := g.idx[j]
			if id := msgs[i].EventID; dup[id] > 0 {
				dup[id]--
				res[i].Duplicate = true
			}
		}
		stored = stored || rr.Inserted > 0 || rr.SeqsWoken > 0
	}
	if stored {
		if err := db.New().NotifyInbox(ctx, tx); err != nil {
			return err
		}
	}
	return nil
}
