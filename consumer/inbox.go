package consumer

import (
	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/inbox"
	"github.com/pgrelay/pgrelay/internal/inboxadapt"
	"github.com/pgrelay/pgrelay/internal/logbridge"
)

// engineInbox converts the public inbox worker configuration to the
// engine's, as pgrelay.NewInboxWorker does.
func engineInbox(c pgrelay.InboxConfig) inbox.Config {
	r := c.Retention
	cfg := inbox.Config{
		Pool: c.Pool, Handler: inboxadapt.NewHandler[pgrelay.InboxEvent](c.Handler, fromInboxEvent),
		HandlerName: c.HandlerName, WorkerID: c.WorkerID, Workers: c.Workers, BatchSize: c.BatchSize,
		Lease: c.Lease, HandlerTimeout: c.HandlerTimeout, MaxAttempts: c.MaxAttempts,
		BackoffMin: c.BackoffMin, BackoffMax: c.BackoffMax, MaxDeferrals: c.MaxDeferrals,
		DeferFallback: c.DeferFallback, PollInterval: c.PollInterval, QueryTimeout: c.QueryTimeout,
		ListenConnConfig: c.ListenConnConfig, NoListen: c.NoListen,
		ShutdownTimeout: c.ShutdownTimeout, Ordered: c.Ordered, GapTimeout: c.GapTimeout,
		StatisticsInterval: c.StatisticsInterval,
		Observer:           inboxadapt.NewObserver[pgrelay.InboxEvent, pgrelay.SeqOutcome](c.Observer, fromInboxEvent),
		Retention: inbox.RetentionConfig{
			Disabled: r.Disabled, Window: r.Window, ReleaseHorizon: r.ReleaseHorizon, BatchSize: r.BatchSize,
			DuplicatesMax: r.DuplicatesMax, Interval: r.Interval, Pause: r.Pause, QueryTimeout: r.QueryTimeout,
		},
	}
	if c.Logger != nil {
		cfg.Logger = logbridge.Or(c.Logger)
	}
	if r.Observer != nil {
		cfg.Retention.Observer = r.Observer
	}
	return cfg
}

// fromInboxEvent converts a claimed engine event for a handler.
func fromInboxEvent(ev *inbox.Event) *pgrelay.InboxEvent {
	return &pgrelay.InboxEvent{Message: pgrelay.Message(ev.Message), Handler: ev.Handler, DedupKey: ev.DedupKey,
		ReceivedAt: ev.ReceivedAt, Attempts: ev.Attempts, Deferrals: ev.Deferrals,
		LockVersion: ev.LockVersion, LastError: ev.LastError}
}

// retentionTee tells both observers what the inbox's upkeep did.
type retentionTee struct{ a, b inbox.RetentionObserver }

func (t retentionTee) Deleted(n int64)  { t.a.Deleted(n); t.b.Deleted(n) }
func (t retentionTee) Failed(err error) { t.a.Failed(err); t.b.Failed(err) }
