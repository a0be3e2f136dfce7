package pgrelay_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// remoteCalls is a handler with an effect outside the database (it declares
// pgrelay.ExternalHandler): it counts its calls per event id, as a receiver
// that does not deduplicate would apply them, and records per key the order
// of the calls that succeeded. fail says how a call fails (nil: it succeeds).
type remoteCalls struct {
	fail func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent, call int) error

	mu    sync.Mutex
	calls map[string]int
	order map[string][]int64 // key -> KeySeq of each successful call
}

func newRemoteCalls(fail func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent, call int) error) *remoteCalls {
	return &remoteCalls{fail: fail, calls: map[string]int{}, order: map[string][]int64{}}
}

func (r *remoteCalls) ExternalEffects() bool { return true }

func (r *remoteCalls) Handle(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
	r.mu.Lock()
	r.calls[ev.EventID]++
	n := r.calls[ev.EventID]
	r.mu.Unlock()
	if r.fail != nil {
		if err := r.fail(ctx, tx, ev, n); err != nil {
			return err
		}
	}
	r.mu.Lock()
	r.order[ev.Key] = append(r.order[ev.Key], ev.KeySeq)
	r.mu.Unlock()
	return nil
}

func (r *remoteCalls) count(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[id]
}

func (r *remoteCalls) succeeded(key string) []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.order[key])
}

// failFirstCall fails the first call of the events in ids, transiently.
func failFirstCall(ids ...string) func(context.Context, pgx.Tx, *pgrelay.InboxEvent, int) error {
	return func(_ context.Context, _ pgx.Tx, ev *pgrelay.InboxEvent, call int) error {
		if call == 1 && slices.Contains(ids, ev.EventID) {
			return errors.New("remote answered 500")
		}
		return nil
	}
}

func plainMsgs(prefix string, n int) []pgrelay.Incoming {
	msgs := make([]pgrelay.Incoming, n)
	for i := range msgs {
		msgs[i] = seqMsg(fmt.Sprintf("%s%03d", prefix, i), fmt.Sprintf("k%d", i), 0)
	}
	return msgs
}

func waitAllProcessed(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox WHERE status = 'processed'`) == n
	}, 30*time.Second, 10*time.Millisecond, "not all %d events processed", n)
}

// requireCalls checks that every event of msgs was called once, except those
// in twice.
func requireCalls(t *testing.T, h *remoteCalls, msgs []pgrelay.Incoming, twice ...string) {
	t.Helper()
	var wrong []string
	for _, m := range msgs {
		want := 1
		if slices.Contains(twice, m.EventID) {
			want = 2
		}
		if got := h.count(m.EventID); got != want {
			wrong = append(wrong, fmt.Sprintf("%s: %d calls, want %d", m.EventID, got, want))
		}
	}
	require.Empty(t, wrong, "an external call that succeeded was made again")
}

// TestExternalHandlerFailureRepeatsNoSuccess: a batch of an external handler
// in which events fail transiently, or break their transaction (a handler
// timeout inside a query kills the connection), commits each event on its
// own: the events that succeeded before a failure are not called again, the
// ones after it are called once, and the failed ones once per attempt.
func TestExternalHandlerFailureRepeatsNoSuccess(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	h := newRemoteCalls(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent, call int) error {
		switch {
		case call > 1:
			return nil
		case ev.EventID == "x007", ev.EventID == "x031":
			return errors.New("remote answered 500")
		case ev.EventID == "x018":
			// Outlives the handler timeout inside a query: the batch
			// transaction's connection is broken.
			_, err := tx.Exec(ctx, `SELECT pg_sleep(30)`)
			return err
		}
		return nil
	})
	msgs := plainMsgs("x", 40)
	receive(t, pool, msgs...)
	cfg := fastConfig(t, pool, h)
	cfg.Workers, cfg.BatchSize, cfg.HandlerTimeout = 1, 40, 300*time.Millisecond
	startWorker(t, cfg)
	waitAllProcessed(t, pool, len(msgs))
	requireCalls(t, h, msgs, "x007", "x018", "x031")
	for _, id := range []string{"x007", "x018", "x031"} {
		require.Equal(t, 2, inboxRow(t, pool, id).Attempts, id)
	}
	require.Equal(t, 1, inboxRow(t, pool, "x019").Attempts, "handed back after the broken transaction: attempt refunded")
}

// TestApplyStoredLeavesExternalHandlersToTheWorkers: applying on receive runs
// the handler in the receiving transaction, all or nothing, so a failure
// there would roll back calls that succeeded and the workers would make them
// again. For an external handler it applies nothing; the workers call each
// event once.
func TestApplyStoredLeavesExternalHandlersToTheWorkers(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	h := newRemoteCalls(failFirstCall("r5"))
	w, err := pgrelay.NewInboxWorker(fastConfig(t, pool, h))
	require.NoError(t, err)
	msgs := []pgrelay.Incoming{}
	for i := range 10 {
		msgs = append(msgs, seqMsg(fmt.Sprintf("r%d", i), "k", 0))
	}
	res, n := receiveAndApply(t, w, pool, msgs...)
	require.Equal(t, 10, res.Inserted)
	require.Zero(t, n, "nothing applied in the receiving transaction")
	for _, m := range msgs {
		require.Zero(t, h.count(m.EventID), "%s called in the receiving transaction", m.EventID)
	}
	startWorker(t, fastConfig(t, pool, h))
	waitAllProcessed(t, pool, len(msgs))
	requireCalls(t, h, msgs, "r5")
}

// TestExternalHandlerOrdered: in ordered mode an external handler's events
// are committed one by one and still applied in each key's sequence: after a
// failure of a key's event its later events wait, and nothing is called twice
// except the failed event.
func TestExternalHandlerOrdered(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	h := newRemoteCalls(failFirstCall("a3"))
	var msgs []pgrelay.Incoming
	for seq := int64(5); seq >= 1; seq-- { // stored in reverse
		msgs = append(msgs, seqMsg(fmt.Sprintf("a%d", seq), "a", seq), seqMsg(fmt.Sprintf("b%d", seq), "b", seq))
	}
	receive(t, pool, msgs...)
	cfg := orderedConfig(t, pool, h, &seqObserver{})
	cfg.BatchSize = 10
	startWorker(t, cfg)
	waitAllProcessed(t, pool, len(msgs))
	requireCalls(t, h, msgs, "a3")
	require.Equal(t, []int64{1, 2, 3, 4, 5}, h.succeeded("a"))
	require.Equal(t, []int64{1, 2, 3, 4, 5}, h.succeeded("b"))
}
