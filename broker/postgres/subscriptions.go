package postgres

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/db"
)

// DB is what Register, Unregister and Registered run their statements on: a
// *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type DB interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
	Query(context.Context, string, ...any) (pgx.Rows, error)
	QueryRow(context.Context, string, ...any) pgx.Row
}

// Subscription is a handler the publisher stores events for in the target
// database: one inbox row per event, deduplicated by the handler's key.
type Subscription struct {
	// Handler is the handler's name (the inbox rows' handler). Default
	// "default".
	Handler string
	// DedupKey is the key strategy spec of the handler's rows, as
	// pgrelay.Target.DedupKey takes it. Default "message-id".
	DedupKey string
	// DedupKeyByTopic overrides DedupKey for the named topics.
	DedupKeyByTopic map[string]string
	// Topics are the topics stored for the handler. Default (nil): every
	// topic.
	Topics []string
}

// target parses s into the inbox's target and its topic filter (nil: every
// topic).
func (s Subscription) target() (pgrelay.Target, map[string]bool, error) {
	t := pgrelay.Target{Handler: s.Handler, DedupKey: s.DedupKey, DedupKeyByTopic: s.DedupKeyByTopic}
	if t.Handler == "" {
		t.Handler = pgrelay.DefaultHandlerName
	}
	if err := pgrelay.ValidateHandlerName(t.Handler); err != nil {
		return t, nil, err
	}
	if err := pgrelay.ValidateKeyStrategy(s.DedupKey); err != nil {
		return t, nil, fmt.Errorf("handler %q: %w", t.Handler, err)
	}
	for topic, spec := range s.DedupKeyByTopic {
		if err := pgrelay.ValidateKeyStrategy(spec); err != nil {
			return t, nil, fmt.Errorf("handler %q, topic %q: %w", t.Handler, topic, err)
		}
	}
	if s.Topics == nil {
		return t, nil, nil
	}
	topics := make(map[string]bool, len(s.Topics))
	for _, topic := range s.Topics {
		if topic == "" {
			return t, nil, fmt.Errorf("handler %q: an empty topic", t.Handler)
		}
		topics[topic] = true
	}
	return t, topics, nil
}

// RegisterTargets returns Register of targets, each taking topics (nil:
// every topic), for consumer.Config.Register: a direct consumer
// (consumer.Config.Direct) registers its targets at start-up.
func RegisterTargets(q DB, topics []string, targets ...pgrelay.Target) func(context.Context) error {
	subs := make([]Subscription, len(targets))
	for i, t := range targets {
		subs[i] = Subscription{Handler: t.Handler, DedupKey: t.DedupKey, DedupKeyByTopic: t.DedupKeyByTopic, Topics: topics}
	}
	return func(ctx context.Context) error { return Register(ctx, q, subs...) }
}

// Register records subs in the target database's pgrelay.inbox_subscriptions
// (replacing the settings of a handler registered before), in one
// transaction: every event the publisher stores after it commits is stored
// for them.
func Register(ctx context.Context, q DB, subs ...Subscription) error {
	seen := map[string]bool{}
	params := make([]db.UpsertInboxSubscriptionParams, 0, len(subs))
	for _, s := range subs {
		t, _, err := s.target()
		if err != nil {
			return fmt.Errorf("postgres: register: %w", err)
		}
		if seen[t.Handler] {
			return fmt.Errorf("postgres: register: handler %q is named twice", t.Handler)
		}
		seen[t.Handler] = true
		byTopic := s.DedupKeyByTopic
		if byTopic == nil {
			byTopic = map[string]string{}
		}
		bt, err := json.Marshal(byTopic)
		if err != nil {
			return fmt.Errorf("postgres: register: %w", err)
		}
		var topics []string
		if s.Topics != nil {
			topics = slices.Sorted(maps.Keys(setOf(s.Topics)))
		}
		params = append(params, db.UpsertInboxSubscriptionParams{Handler: t.Handler, DedupKey: cmp.Or(t.DedupKey, "message-id"),
			DedupKeyByTopic: bt, Topics: topics})
	}
	tx, err := beginner(q)
	if err != nil {
		return err
	}
	return tx(ctx, func(tx DB) error {
		for _, p := range params {
			if err := db.New().UpsertInboxSubscription(ctx, tx, p); err != nil {
				return fmt.Errorf("postgres: register handler %q: %w", p.Handler, err)
			}
		}
		return nil
	})
}

// beginner returns a function running its argument in a transaction on q,
// or in q itself when q is already a transaction.
func beginner(q DB) (func(context.Context, func(DB) error) error, error) {
	if _, ok := q.(pgx.Tx); ok {
		return func(_ context.Context, f func(DB) error) error { return f(q) }, nil
	}
	b, ok := q.(interface {
		Begin(context.Context) (pgx.Tx, error)
	})
	if !ok {
		return nil, errors.New("postgres: register: the DB can begin no transaction")
	}
	return func(ctx context.Context, f func(DB) error) error {
		return pgx.BeginFunc(ctx, b, func(tx pgx.Tx) error { return f(tx) })
	}, nil
}

func setOf(s []string) map[string]bool {
	m := make(map[string]bool, len(s))
	for _, v := range s {
		m[v] = true
	}
	return m
}

// Unregister removes handler's subscription: the publisher stores no more
// events for it (its stored rows stay). It reports whether there was one.
func Unregister(ctx context.Context, q DB, handler string) (bool, error) {
	n, err := db.New().DeleteInboxSubscription(ctx, q, handler)
	if err != nil {
		return false, fmt.Errorf("postgres: unregister %q: %w", handler, err)
	}
	return n > 0, nil
}

// Registered returns the subscriptions of the target database, by handler.
func Registered(ctx context.Context, q DB) ([]Subscription, error) {
	rows, err := db.New().InboxSubscriptions(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("postgres: read pgrelay.inbox_subscriptions: %w", err)
	}
	out := make([]Subscription, len(rows))
	for i, r := range rows {
		out[i] = Subscription{Handler: r.Handler, DedupKey: r.DedupKey, Topics: r.Topics}
		if len(r.DedupKeyByTopic) > 0 {
			if err := json.Unmarshal(r.DedupKeyByTopic, &out[i].DedupKeyByTopic); err != nil {
				return nil, fmt.Errorf("postgres: handler %q: dedup_key_by_topic: %w", r.Handler, err)
			}
			if len(out[i].DedupKeyByTopic) == 0 {
				out[i].DedupKeyByTopic = nil
			}
		}
	}
	return out, nil
}
