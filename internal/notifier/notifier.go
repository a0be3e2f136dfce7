// Package notifier keeps one PostgreSQL connection listening on a service's
// notification channels and hands each notification to the channel's
// subscriber. The relay (outbox wake-ups, relay membership) and the inbox
// workers (stored events) both wake through it; a lost connection is dialled
// again with backoff while the services fall back to polling.
package notifier

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/internal/wait"
)

// The channels pgrelay notifies.
const (
	// OutboxChannel is notified by the outbox insert trigger for armed
	// partitions; the payload lists them ("3,7,12").
	OutboxChannel = "pgrelay_outbox"
	// RelaysChannel is notified by a relay that released partitions
	// (queries/relay.sql, NotifyRelays), so that the others take them at once
	// rather than at their next heartbeat.
	RelaysChannel = "pgrelay_relays"
	// InboxChannel is notified when inbox rows were stored (the inbox insert
	// trigger, inbox.Notify).
	InboxChannel = "pgrelay_inbox"
)

// Topic subscribes a function to one channel.
type Topic struct {
	// Channel is the channel listened on. Required.
	Channel string
	// Notify is called with each notification's payload, on the notifier's
	// goroutine: it must not block. Required.
	Notify func(payload string)
}

// Config configures a Notifier.
type Config struct {
	// Pool is the service's database: the listening connection is dialled
	// with its connection settings, beside the pool, so that it never waits
	// for a pool connection nor takes one from the service. Required.
	Pool *pgxpool.Pool
	// ConnConfig, when set, is dialled for LISTEN instead of the pool's
	// connection settings: a direct connection to PostgreSQL when the pool
	// goes through a pooler in transaction mode. Default: the pool's.
	ConnConfig *pgx.ConnConfig
	// Topics are the channels listened on, in this order. At least one.
	Topics []Topic
	// OnListen is called each time the connection listens again on every
	// channel (the first time included): notifications sent while it was not
	// listening are lost, so the service looks for work then. Default: none.
	OnListen func()
	// Backoff paces the reconnects; it starts from Min again once a
	// connection stayed up for StableAfter. Default: 100ms doubling up to
	// 30s, ×0.5–1.5.
	Backoff wait.Policy
	// StableAfter is how long a connection must have lasted for its loss to
	// count as a first failure again. Default: 1m.
	StableAfter time.Duration
	// QueryTimeout bounds the dial and each LISTEN. Default: 10s.
	QueryTimeout time.Duration
	// Logger receives a warning per lost connection. Default: a no-op logger.
	Logger *slog.Logger
}

// Defaults for Config.
var defaultBackoff = wait.Policy{Min: 100 * time.Millisecond, Max: 30 * time.Second, Spread: 0.5}

const (
	defaultStableAfter  = time.Minute
	defaultQueryTimeout = 10 * time.Second
)

// Notifier listens on its Config's channels until its context ends.
type Notifier struct {
	cfg Config
	// listening, when set (tests), is told each time the connection listens.
	listening func(pid uint32)
}

// New checks cfg and returns a Notifier; Run starts it.
func New(cfg Config) (*Notifier, error) {
	if cfg.Backoff.Min <= 0 {
		cfg.Backoff = defaultBackoff
	}
	if cfg.StableAfter <= 0 {
		cfg.StableAfter = defaultStableAfter
	}
	if cfg.QueryTimeout <= 0 {
		cfg.QueryTimeout = defaultQueryTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	var errs []error
	if cfg.Pool == nil {
		errs = append(errs, errors.New("notifier: Config.Pool is required"))
	}
	if len(cfg.Topics) == 0 {
		errs = append(errs, errors.New("notifier: Config.Topics needs at least one channel"))
	}
	for i, t := range cfg.Topics {
		if !plainName(t.Channel) || t.Notify == nil {
			errs = append(errs, fmt.Errorf("notifier: Config.Topics[%d] needs a Channel of lower-case letters, digits and _ (at most 63) and a Notify function, got %q", i, t.Channel))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &Notifier{cfg: cfg}, nil
}

// Run listens until ctx is cancelled, dialling again with backoff whenever
// the connection fails.
func (n *Notifier) Run(ctx context.Context) {
	bo := wait.New(n.cfg.Backoff)
	for ctx.Err() == nil {
		start := time.Now()
		err := n.listen(ctx)
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) >= n.cfg.StableAfter {
			bo.Reset()
		}
		d := bo.Next()
		n.cfg.Logger.Warn("LISTEN connection lost; polling until it is back", slog.Any("error", err), slog.Duration("retry_in", d))
		wait.Sleep(ctx, d)
	}
}

// listen dials, listens on every channel, then delivers notifications until
// the connection fails or ctx ends.
func (n *Notifier) listen(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, n.cfg.QueryTimeout)
	defer cancel()
	cc := n.cfg.ConnConfig
	if cc == nil {
		cc = n.cfg.Pool.Config().ConnConfig
	}
	conn, err := pgx.ConnectConfig(cctx, cc.Copy())
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()
	handlers := make(map[string]func(string), len(n.cfg.Topics))
	for _, t := range n.cfg.Topics {
		// LISTEN is a utility statement sqlc cannot generate code for; New
		// let only plain lower-case names through.
		if _, err := conn.Exec(cctx, "LISTEN "+t.Channel); err != nil {
			return fmt.Errorf("listen %s: %w", t.Channel, err)
		}
		handlers[t.Channel] = t.Notify
	}
	cancel()
	if n.listening != nil {
		n.listening(conn.PgConn().PID())
	}
	if n.cfg.OnListen != nil {
		n.cfg.OnListen()
	}
	for {
		msg, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		if notify := handlers[msg.Channel]; notify != nil {
			notify(msg.Payload)
		}
	}
}

// plainName reports whether s is an identifier PostgreSQL takes unquoted and
// unchanged: a lower-case letter or _, then lower-case letters, digits and _.
func plainName(s string) bool {
	if s == "" || len(s) > 63 || s[0] >= '0' && s[0] <= '9' {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}
