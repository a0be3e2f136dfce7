package main

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/inbox"
)

// fromEngine adapts one of the command's handlers (the ledger, sql and http
// handlers, written against the inbox engine) to the public handler type
// the consumer package runs.
func fromEngine(h inbox.Handler) pgrelay.InboxHandler {
	if bh, ok := h.(inbox.BatchHandler); ok {
		return engineBatchHandler{engineHandler{h}, bh}
	}
	return engineHandler{h}
}

func toEngine(ev *pgrelay.InboxEvent) *inbox.Event {
	return &inbox.Event{Message: event.Message(ev.Message), Handler: ev.Handler, DedupKey: ev.DedupKey,
		ReceivedAt: ev.ReceivedAt, Attempts: ev.Attempts, Deferrals: ev.Deferrals,
		LockVersion: ev.LockVersion, LastError: ev.LastError}
}

type engineHandler struct{ h inbox.Handler }

func (a engineHandler) Handle(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
	return a.h.Handle(ctx, tx, toEngine(ev))
}

// ExternalEffects reports what the engine handler reports
// (inbox.ExternalHandler: the webhook handler's calls are outside the
// database).
func (a engineHandler) ExternalEffects() bool {
	e, ok := a.h.(inbox.ExternalHandler)
	return ok && e.ExternalEffects()
}

type engineBatchHandler struct {
	engineHandler
	bh inbox.BatchHandler
}

func (a engineBatchHandler) HandleBatch(ctx context.Context, tx pgx.Tx, evs []*pgrelay.InboxEvent) error {
	out := make([]*inbox.Event, len(evs))
	for i, ev := range evs {
		out[i] = toEngine(ev)
	}
	return a.bh.HandleBatch(ctx, tx, out)
}
