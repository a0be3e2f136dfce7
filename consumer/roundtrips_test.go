package consumer

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/internal/ledger"
	"github.com/pgrelay/pgrelay/internal/ledger/ledgertest"
	"github.com/pgrelay/pgrelay/internal/logtest"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// TestApplyOnReceiveRoundTrips: a batch applied on receive costs BEGIN, one
// round trip storing it (the savepoint and the insert together), the
// handler's own statements and COMMIT: nothing is read back or marked after
// the handler (7 round trips with the ledger handler before, 4 now). Reading the stored rows back, marking them after the handler
// or sending the savepoint on its own turns this red.
func TestApplyOnReceiveRoundTrips(t *testing.T) {
	t.Parallel()
	// The default mode, and the one for poolers (docs/pooler.md).
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe} {
		t.Run(mode.String(), func(t *testing.T) { testApplyOnReceiveRoundTrips(t, mode) })
	}
}

func testApplyOnReceiveRoundTrips(t *testing.T, mode pgx.QueryExecMode) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, trips := testdb.RoundTripPool(t, mode)

	c, err := newConsumer(Config{
		Pool:           pool,
		Subscribe:      func(context.Context) (broker.Subscriber, error) { return &oneShotSubscriber{}, nil },
		FetchBatchSize: 20,
		StatsInterval:  -1,
		Inbox:          pgrelay.InboxConfig{Handler: ledgertest.Traced{Trips: trips}},
		Logger:         logtest.New(t),
	})
	require.NoError(t, err)

	msg := func(id, typ string, v any) pgrelay.Incoming {
		b, err := json.Marshal(v)
		require.NoError(t, err)
		return pgrelay.Incoming{Message: pgrelay.Message{EventID: id, Topic: "orders", Key: "o", EventType: typ, Payload: b,
			OccurredAt: time.Now()}}
	}
	for round := range 3 {
		order := fmt.Sprintf("o-%d", round)
		batch := []pgrelay.Incoming{
			msg("created-"+order, ledger.EventOrderCreated, ledger.OrderCreated{OrderID: order, CustomerID: "c", AmountCents: 100, Currency: "EUR"}),
		}
		if round > 0 {
			// Two events: HandleBatch.
			prev := fmt.Sprintf("o-%d", round-1)
			batch = append(batch, msg("paid-"+prev, ledger.EventOrderPaid, ledger.OrderPaid{OrderID: prev, AmountCents: 100, Currency: "EUR"}))
		}
		trips.Reset()
		before := c.Stats().AppliedOnReceive
		require.NoError(t, c.store(ctx, batch, true, nil))
		got, inHandler := trips.Reset()
		// What follows the commit (waking the events deferred on a
		// dependency the handler released) is not the transaction's.
		require.Contains(t, got, "commit")
		got = got[:slices.Index(got, "commit")+1]
		require.Equal(t, int64(len(batch)), c.Stats().AppliedOnReceive-before, "round %d: not applied on receive", round)
		require.Positive(t, inHandler, "round %d: the handler ran no statement", round)
		t.Logf("round %d, %d events: %d round trips, %d of them the handler's: %q", round, len(batch), len(got), inHandler, got)
		require.Equal(t, 3, len(got)-inHandler,
			"round %d: BEGIN, the store and COMMIT besides the handler's statements, got %q", round, got)
	}
	var n int
	require.NoError(t, pool.QueryRow(ctx,
		`SELECT count(*) FROM pgrelay.inbox WHERE status = 'processed' AND attempts = 1 AND lock_version = 1`).Scan(&n))
	require.Equal(t, 5, n)
}
