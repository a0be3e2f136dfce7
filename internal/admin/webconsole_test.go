package admin_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/admin"
	"github.com/pgrelay/pgrelay/internal/admin/admintest"
)

// TestThroughputPerMinute: the inbox events each handler processed and the
// outbox rows published, per minute over the window, from the rows' own
// times; older rows and other statuses do not count.
func TestThroughputPerMinute(t *testing.T) {
	t.Parallel()
	b := admintest.Setup(t)
	ctx := context.Background()
	admintest.InsertRows(t, b.Pool,
		admintest.Row{ID: "p1", Topic: "orders", Type: "T", Status: "processed", FinishedAgo: 0},
		admintest.Row{ID: "p2", Topic: "orders", Type: "T", Status: "processed", FinishedAgo: 0},
		admintest.Row{ID: "p3", Topic: "orders", Type: "T", Status: "processed", FinishedAgo: 10 * time.Minute},
		admintest.Row{ID: "old", Topic: "orders", Type: "T", Status: "processed", FinishedAgo: 2 * time.Hour},
		admintest.Row{ID: "dead", Topic: "orders", Type: "T", Status: "dead", FinishedAgo: 0},
	)
	_, err := b.Pool.Exec(ctx, `UPDATE pgrelay.inbox SET handler = 'billing' WHERE event_id = 'p2'`)
	require.NoError(t, err)
	admintest.OutboxRow(t, b.Pool, "o1", "orders", "T", false, 0, "")
	_, err = b.Pool.Exec(ctx, `UPDATE pgrelay.outbox SET status = 'published', published_at = now() WHERE event_id = 'o1'`)
	require.NoError(t, err)

	series, err := b.Svc.Throughput(ctx, 60)
	require.NoError(t, err)
	require.Len(t, series, 3)
	got := map[string]int64{}
	for _, s := range series {
		require.Len(t, s.Minutes, 60)
		var sum int64
		for _, m := range s.Minutes {
			sum += m.Count
		}
		require.Equal(t, s.Total, sum)
		got[string(s.Source)+"/"+s.Handler] = s.Total
	}
	require.Equal(t, map[string]int64{"outbox/": 1, "inbox/billing": 1, "inbox/default": 2}, got)
	require.Equal(t, admin.SourceOutbox, series[0].Source, "the outbox first")
	def := series[2]
	require.Equal(t, int64(1), def.Minutes[59].Count+def.Minutes[58].Count, "p1 in the current minute (or the one before, at a minute's turn)")
	_, err = b.Svc.Throughput(ctx, 2000)
	require.ErrorIs(t, err, admin.ErrInvalid)
}

// TestDeadFilterByKey: the dead-letter filter matches the event's key, for
// list and requeue alike.
func TestDeadFilterByKey(t *testing.T) {
	t.Parallel()
	b := admintest.Setup(t)
	admintest.Fixtures(t, b.Pool)
	ctx := context.Background()
	_, err := b.Pool.Exec(ctx, `UPDATE pgrelay.inbox SET key = 'customer-7' WHERE event_id IN ('d-orders-1', 'd-users-1')`)
	require.NoError(t, err)
	list, err := b.Svc.ListDead(ctx, admin.SourceInbox, admin.Filter{Key: "customer-7"})
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"d-orders-1", "d-users-1"}, admintest.IDs(list))
	res, err := b.Svc.Requeue(ctx, admin.SourceInbox, admin.RequeueRequest{Filter: admin.Filter{Key: "customer-7", Topic: "users"},
		Actor: "t", Reason: "r"})
	require.NoError(t, err)
	require.Equal(t, []string{"d-users-1"}, admintest.AffectedIDs(res))
	admintest.OutboxRow(t, b.Pool, "o-dead", "orders", "T", true, time.Hour, "nope")
	out, err := b.Svc.ListDead(ctx, admin.SourceOutbox, admin.Filter{Key: "o-dead"})
	require.NoError(t, err)
	require.Equal(t, []string{"o-dead"}, admintest.IDs(out))
	out, err = b.Svc.ListDead(ctx, admin.SourceOutbox, admin.Filter{Key: "other"})
	require.NoError(t, err)
	require.Empty(t, out)
}

// TestPartitionLeaseExpiry: the outbox overview gives each partition's lease
// expiry, and none for a partition never held.
func TestPartitionLeaseExpiry(t *testing.T) {
	t.Parallel()
	b := admintest.Setup(t)
	ctx := context.Background()
	_, err := b.Pool.Exec(ctx, `UPDATE pgrelay.relay_partitions SET owner = 'n1', epoch = 3, lease_until = now() + interval '30 seconds' WHERE partition = 1`)
	require.NoError(t, err)
	ov, err := b.Svc.Outbox(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, ov.Partitions)
	for _, p := range ov.Partitions {
		if p.Partition == 1 {
			require.True(t, p.Held)
			require.NotNil(t, p.LeaseUntil)
			require.WithinDuration(t, time.Now().Add(30*time.Second), *p.LeaseUntil, 10*time.Second)
		} else {
			require.Nil(t, p.LeaseUntil, "partition %d was never held", p.Partition)
		}
	}
}
