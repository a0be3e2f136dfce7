// Package ledgertest holds test support for the ledger handler: a handler
// that marks the round trips it makes, for tests counting a path's round
// trips with testdb.RoundTrips.
package ledgertest

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/ledger"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// Traced is the ledger handler, setting Trips.Handler while it runs so that
// the round trips it makes are counted as the handler's.
type Traced struct {
	ledger.Handler
	Trips *testdb.RoundTrips
}

var _ pgrelay.InboxBatchHandler = Traced{}

// Handle implements pgrelay.InboxHandler.
func (h Traced) Handle(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
	h.Trips.Handler.Store(true)
	defer h.Trips.Handler.Store(false)
	return h.Handler.Handle(ctx, tx, ev)
}

// HandleBatch implements pgrelay.InboxBatchHandler.
func (h Traced) HandleBatch(ctx context.Context, tx pgx.Tx, evs []*pgrelay.InboxEvent) error {
	h.Trips.Handler.Store(true)
	defer h.Trips.Handler.Store(false)
	return h.Handler.HandleBatch(ctx, tx, evs)
}
