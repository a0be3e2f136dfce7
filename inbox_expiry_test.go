package pgrelay_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/inboxtest"
	"github.com/pgrelay/pgrelay/internal/metrics"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// applied records the events a handler ran, with the expiry it saw.
type applied struct {
	mu      sync.Mutex
	expires map[string]time.Time
	batches int
}

func (a *applied) Handle(_ context.Context, _ pgx.Tx, ev *pgrelay.InboxEvent) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.expires[ev.EventID] = ev.ExpiresAt
	return nil
}

// batchApplied is applied as a BatchHandler.
type batchApplied struct{ *applied }

func (b batchApplied) HandleBatch(ctx context.Context, tx pgx.Tx, evs []*pgrelay.InboxEvent) error {
	b.mu.Lock()
	b.batches++
	b.mu.Unlock()
	for _, ev := range evs {
		if err := b.Handle(ctx, tx, ev); err != nil {
			return err
		}
	}
	return nil
}

func (a *applied) seen(id string) (time.Time, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t, ok := a.expires[id]
	return t, ok
}

// TestExpiredEventIsNotApplied: an event whose ExpiresAt has passed when a
// worker would run it is stored dead with a reason starting "expired",
// counted under that reason, and its handler never runs; an event expiring
// later is applied and its handler sees ExpiresAt (stored in the inbox's
// headers and lifted back). With a per-event and with a batch handler.
func TestExpiredEventIsNotApplied(t *testing.T) {
	t.Parallel()
	for _, batch := range []bool{false, true} {
		t.Run(map[bool]string{false: "handler", true: "batch-handler"}[batch], func(t *testing.T) {
			t.Parallel()
			pool, err := pgxpool.New(context.Background(), testdb.NewURL(t))
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			now := time.Now()
			later := now.Add(time.Hour).Round(time.Microsecond).UTC()
			msg := func(id string, exp time.Time) pgrelay.Incoming {
				return pgrelay.Incoming{Message: pgrelay.Message{EventID: id, Topic: "orders", EventType: "Reminder",
					Payload: []byte("{}"), ExpiresAt: exp}}
			}
			receive(t, pool, msg("stale", now.Add(-time.Second)), msg("fresh", later), msg("forever", time.Time{}))

			a := &applied{expires: map[string]time.Time{}}
			var h pgrelay.InboxHandler = a
			if batch {
				h = batchApplied{a}
			}
			obs := &inboxtest.CountingObserver{}
			cfg := fastConfig(t, pool, h)
			cfg.Observer = obs
			startWorker(t, cfg)
			require.Eventually(t, func() bool {
				s := obs.Snapshot()
				return s.Processed == 2 && s.Dead == 1
			}, 10*time.Second, 10*time.Millisecond)

			_, ran := a.seen("stale")
			require.False(t, ran, "the expired event's handler ran")
			exp, ok := a.seen("fresh")
			require.True(t, ok)
			require.True(t, exp.Equal(later), "handler saw ExpiresAt %s, want %s", exp, later)
			exp, ok = a.seen("forever")
			require.True(t, ok)
			require.True(t, exp.IsZero())

			reason, ok := obs.DeadReason("stale")
			require.True(t, ok)
			require.True(t, strings.HasPrefix(reason, "expired"), "reason %q", reason)
			require.Equal(t, metrics.DeadExpired, metrics.ClassifyDead(reason))
			var status, lastError string
			require.NoError(t, pool.QueryRow(context.Background(),
				`SELECT status, last_error FROM pgrelay.inbox WHERE event_id = 'stale'`).Scan(&status, &lastError))
			require.Equal(t, "dead", status)
			require.Equal(t, reason, lastError)
		})
	}
}
