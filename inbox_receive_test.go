package pgrelay_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/inboxtest"
	"github.com/pgrelay/pgrelay/internal/ledger"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// TestDuplicateDeliveriesCreditOnce delivers one OrderPaid five times (four
// separate redeliveries, one of them repeated inside a batch): the inbox counts
// four duplicates and the ledger gets exactly one entry.
func TestDuplicateDeliveriesCreditOnce(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	createOrders(t, pool, "o1")
	paid := orderPaid("pay-1", "o1", 500)

	res := receive(t, pool, paid)
	require.Equal(t, 1, res.Inserted)
	dups := 0
	for range 2 {
		res = receive(t, pool, paid)
		require.Zero(t, res.Inserted)
		dups += len(res.Duplicates)
	}
	// A batch that repeats the event, plus an unrelated one.
	res = receive(t, pool, paid, orderPaid("pay-2", "o1", 1), paid)
	require.Equal(t, 1, res.Inserted)
	require.Equal(t, []string{"pay-1", "pay-1"}, res.Duplicates)
	dups += len(res.Duplicates)
	require.Equal(t, 4, dups)
	// A new event repeated inside one batch: stored once, reported once.
	res = receive(t, pool, orderPaid("pay-3", "o1", 1), orderPaid("pay-3", "o1", 1))
	require.Equal(t, 1, res.Inserted)
	require.Equal(t, []string{"pay-3"}, res.Duplicates)

	stats := &inboxtest.CountingObserver{}
	cfg := fastConfig(t, pool, ledger.Handler{})
	cfg.Observer = stats
	startWorker(t, cfg)
	waitAllDone(t, pool, 10*time.Second)

	require.Equal(t, 1, entries(t, pool, "pay-1"))
	require.Equal(t, 1, entries(t, pool, "pay-2"))
	require.Equal(t, 1, entries(t, pool, "pay-3"))
	require.Equal(t, 1, stats.ProcessedCount("pay-1"))
	// Redelivered after processing: still a duplicate, still one credit.
	res = receive(t, pool, paid)
	require.Equal(t, []string{"pay-1"}, res.Duplicates)
	require.Equal(t, 1, entries(t, pool, "pay-1"))
}

// TestReceiveInCallerTransaction shows Receive joining the caller's
// transaction: rolled back, nothing is stored.
func TestReceiveInCallerTransaction(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	res, err := pgrelay.Receive(ctx, tx, []pgrelay.Incoming{orderPaid("e1", "o1", 1)})
	require.NoError(t, err)
	require.Equal(t, 1, res.Inserted)
	require.NoError(t, tx.Rollback(ctx))
	require.Zero(t, queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox`))
}

// TestReceiveDeadAndInvalid stores malformed input directly as dead, and
// refuses a batch holding an unusable message without storing any of it.
func TestReceiveDeadAndInvalid(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()

	raw := []byte{0xff, 0x00, 'x'}
	res := receive(t, pool, pgrelay.Incoming{
		Message:    pgrelay.Message{EventID: "bad-1", Topic: "orders", Payload: raw},
		DeadReason: "malformed: no event type header",
	})
	require.Equal(t, 1, res.Inserted)
	r := inboxRow(t, pool, "bad-1")
	require.Equal(t, "dead", r.Status)
	require.Equal(t, "malformed: no event type header", r.LastError)
	var payload []byte
	require.NoError(t, pool.QueryRow(ctx, `SELECT payload FROM pgrelay.inbox WHERE event_id = 'bad-1' AND finished_at IS NOT NULL`).Scan(&payload))
	require.Equal(t, raw, payload)

	for _, bad := range []pgrelay.Incoming{
		{Message: pgrelay.Message{EventID: ""}},
		{Message: pgrelay.Message{EventID: "ok", EventType: "a\x00b"}},
		{Message: pgrelay.Message{EventID: "ok", Headers: map[string]string{"h": "\xff"}}},
	} {
		_, err := pgrelay.Receive(ctx, pool, []pgrelay.Incoming{orderPaid("fine", "o", 1), bad})
		var inv *pgrelay.InvalidMessageError
		require.True(t, errors.As(err, &inv), "got %v", err)
		require.Equal(t, 1, inv.Index)
	}
	require.Zero(t, queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox WHERE event_id = 'fine'`))
}

// TestOverlappingReceivesDoNotDeadlock: two consumers store overlapping
// batches at the same time, one in ascending and one in descending id order.
// Unsorted, each insert takes unique-index locks the other one holds, and
// PostgreSQL aborts one with "deadlock detected".
func TestOverlappingReceivesDoNotDeadlock(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	for round := range 10 {
		asc := make([]pgrelay.Incoming, 0, 400)
		for _, id := range ids(fmt.Sprintf("r%d", round), 400) {
			asc = append(asc, orderPaid(id, "o1", 1))
		}
		desc := slices.Clone(asc)
		slices.Reverse(desc)
		start := make(chan struct{})
		errs := make(chan error, 2)
		for _, batch := range [][]pgrelay.Incoming{asc, desc} {
			go func() {
				<-start
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				_, err := pgrelay.Receive(ctx, pool, batch)
				errs <- err
			}()
		}
		close(start)
		for range 2 {
			require.NoError(t, <-errs, "round %d", round)
		}
	}
	require.Equal(t, 4000, queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox`))
}
