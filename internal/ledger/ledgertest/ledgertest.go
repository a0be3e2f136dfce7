// Package ledgertest holds test support for the ledger handler: a handler
// that marks the round trips it makes, for tests counting a path's round
// trips with testdb.RoundTrips.
package ledgertest

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/pgrelay/pgrelay/internal/inbox"
	"github.com/pgrelay/pgrelay/internal/ledger"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// Traced is the ledger handler, setting Trips.Handler while it runs so that
// the round trips it makes are counted as the handler's.
type Traced struct {
	ledger.Handler
	Trips *testdb.RoundTrips
}

var _ inbox.BatchHandler = Traced{}

// Handle implements inbox.Handler.
func (h Traced) Handle(ctx context.Context, tx pgx.Tx, ev *inbox.Event) error {
	h.Trips.Handler.Store(true)
	defer h.Trips.Handler.Store(false)
	return h.Handler.Handle(ctx, tx, ev)
}

// HandleBatch implements inbox.BatchHandler.
func (h Traced) HandleBatch(ctx context.Context, tx pgx.Tx, evs []*inbox.Event) error {
	h.Trips.Handler.Store(true)
	defer h.Trips.Handler.Store(false)
	return h.Handler.HandleBatch(ctx, tx, evs)
}
