package admin_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/admin/admintest"
	"github.com/pgrelay/pgrelay/internal/db"
)

// TestRequeueAndPurgeTakeOnlyRowsStillDead: requeue and purge act on the
// keys the dead-letter list returned, but only on rows still dead when they
// take them: a row another operator requeued meanwhile (or that a worker is
// processing again) is neither requeued twice nor deleted, and gets no audit
// row.
func TestRequeueAndPurgeTakeOnlyRowsStillDead(t *testing.T) {
	t.Parallel()
	b := admintest.Setup(t)
	ctx := context.Background()
	admintest.InsertRows(t, b.Pool,
		admintest.Row{ID: "dead", Topic: "orders", Type: "OrderPaid", Status: "dead", Attempts: 5, LastError: "boom", FinishedAgo: time.Hour},
		admintest.Row{ID: "requeued", Topic: "orders", Type: "OrderPaid", Status: "pending", Attempts: 0},
	)
	admintest.OutboxRow(t, b.Pool, "o-dead", "orders", "OrderPaid", true, time.Hour, "rejected")
	admintest.OutboxRow(t, b.Pool, "o-pending", "orders", "OrderPaid", false, 0, "")
	var deadID, pendingID int64
	require.NoError(t, b.Pool.QueryRow(ctx, `SELECT id FROM pgrelay.outbox WHERE event_id = 'o-dead'`).Scan(&deadID))
	require.NoError(t, b.Pool.QueryRow(ctx, `SELECT id FROM pgrelay.outbox WHERE event_id = 'o-pending'`).Scan(&pendingID))
	q := db.New()
	keys := func(ids ...string) ([]string, []string) {
		var handlers, dedupKeys []string
		for _, id := range ids {
			var h, k string
			require.NoError(t, b.Pool.QueryRow(ctx, `SELECT handler, dedup_key FROM pgrelay.inbox WHERE event_id = $1`, id).Scan(&h, &k))
			handlers, dedupKeys = append(handlers, h), append(dedupKeys, k)
		}
		return handlers, dedupKeys
	}

	hs, ks := keys("dead", "requeued")
	rows, err := q.AdminRequeueInboxDead(ctx, b.Pool, db.AdminRequeueInboxDeadParams{Actor: "t", Reason: "r", Handlers: hs, DedupKeys: ks})
	require.NoError(t, err)
	require.Len(t, rows, 1)
	require.Equal(t, "dead", rows[0].EventID)
	require.Equal(t, int32(5), rows[0].PreviousAttempts)

	// Both are pending now: a purge of their keys deletes nothing.
	before := admintest.Snapshot(t, b.Pool)
	gone, err := q.AdminPurgeInboxDead(ctx, b.Pool, db.AdminPurgeInboxDeadParams{Actor: "t", Reason: "r", Handlers: hs, DedupKeys: ks})
	require.NoError(t, err)
	require.Empty(t, gone)
	require.Equal(t, before, admintest.Snapshot(t, b.Pool))

	orows, err := q.AdminRequeueOutboxDead(ctx, b.Pool, db.AdminRequeueOutboxDeadParams{Actor: "t", Reason: "r", Ids: []int64{deadID, pendingID}})
	require.NoError(t, err)
	require.Len(t, orows, 1)
	require.Equal(t, "o-dead", orows[0].EventID)
	before = admintest.SnapshotOutbox(t, b.Pool)
	ogone, err := q.AdminPurgeOutboxDead(ctx, b.Pool, db.AdminPurgeOutboxDeadParams{Actor: "t", Reason: "r", Ids: []int64{deadID, pendingID}})
	require.NoError(t, err)
	require.Empty(t, ogone)
	require.Equal(t, before, admintest.SnapshotOutbox(t, b.Pool))
}
