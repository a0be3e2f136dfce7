package admin_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/admin"
	"github.com/pgrelay/pgrelay/internal/admin/admintest"
)

// goDead turns the pending fixture q-orders-1 into a third dead orders event.
func goDead(t *testing.T, b *admintest.Bundle) {
	t.Helper()
	_, err := b.Pool.Exec(context.Background(),
		`UPDATE pgrelay.inbox SET status = 'dead', last_error = 'late', finished_at = now() - interval '1 hour' WHERE event_id = 'q-orders-1'`)
	require.NoError(t, err)
}

// TestConfirmBindsTheReviewedEvents: a dry run shows 2 dead events and a
// third goes dead before the confirmed run: the run changes nothing and says
// why; a new review covers the 3 and its confirmation runs on exactly them.
func TestConfirmBindsTheReviewedEvents(t *testing.T) {
	t.Parallel()
	b := admintest.Setup(t)
	admintest.Fixtures(t, b.Pool)
	ctx := context.Background()
	zero := time.Duration(0)
	req := admin.PurgeRequest{Filter: admin.Filter{Topic: "orders"}, OlderThan: &zero, Actor: "bob", Reason: "junk", DryRun: true}
	dry, err := b.Svc.Purge(ctx, admin.SourceInbox, req)
	require.NoError(t, err)
	require.Equal(t, []string{"d-orders-1", "d-orders-2"}, admintest.AffectedIDs(dry))
	require.NotEmpty(t, dry.Confirm)
	require.WithinDuration(t, time.Now().Add(admin.DefaultConfirmTTL), *dry.ConfirmExpires, time.Minute)

	goDead(t, b)
	before := admintest.Snapshot(t, b.Pool)
	req.DryRun, req.Confirm = false, dry.Confirm
	_, err = b.Svc.Purge(ctx, admin.SourceInbox, req)
	require.ErrorIs(t, err, admin.ErrStale)
	require.ErrorContains(t, err, "the events it selects now (3) are not the 2 reviewed")
	require.Equal(t, before, admintest.Snapshot(t, b.Pool), "nothing was purged")

	// The confirmation is bound to the action, the actor and the reason too.
	for _, other := range []admin.PurgeRequest{{Actor: "mallory", Reason: "junk"}, {Actor: "bob", Reason: "other"}} {
		other.Filter, other.OlderThan, other.Confirm = req.Filter, &zero, dry.Confirm
		_, err = b.Svc.Purge(ctx, admin.SourceInbox, other)
		require.ErrorIs(t, err, admin.ErrStale)
	}
	_, err = b.Svc.Requeue(ctx, admin.SourceInbox, admin.RequeueRequest{Filter: req.Filter, Actor: "bob", Reason: "junk", Confirm: dry.Confirm})
	require.ErrorIs(t, err, admin.ErrStale)
	_, err = b.Svc.Purge(ctx, admin.SourceInbox, admin.PurgeRequest{Filter: req.Filter, OlderThan: &zero, Actor: "bob", Confirm: "v1.2.x"})
	require.ErrorIs(t, err, admin.ErrInvalid)
	require.Equal(t, before, admintest.Snapshot(t, b.Pool))

	req.DryRun, req.Confirm = true, ""
	dry, err = b.Svc.Purge(ctx, admin.SourceInbox, req)
	require.NoError(t, err)
	req.DryRun, req.Confirm = false, dry.Confirm
	res, err := b.Svc.Purge(ctx, admin.SourceInbox, req)
	require.NoError(t, err)
	require.Equal(t, []string{"d-orders-1", "d-orders-2", "q-orders-1"}, admintest.AffectedIDs(res))
	require.Empty(t, res.Confirm, "only a dry run issues a confirmation")
}

// TestConfirmExpires: a confirmation is refused once its time is up, even
// when the selection is unchanged.
func TestConfirmExpires(t *testing.T) {
	t.Parallel()
	b := admintest.Setup(t)
	admintest.Fixtures(t, b.Pool)
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	svc, err := admin.New(admin.Config{Pool: b.Pool, Now: func() time.Time { return time.Unix(0, now.Load()) }})
	require.NoError(t, err)
	ctx := context.Background()
	req := admin.RequeueRequest{Filter: admin.Filter{Topic: "orders"}, Actor: "alice", Reason: "fixed", DryRun: true}
	dry, err := svc.Requeue(ctx, admin.SourceInbox, req)
	require.NoError(t, err)
	require.Equal(t, 2, dry.Count)

	now.Add(int64(admin.DefaultConfirmTTL + time.Second))
	before := admintest.Snapshot(t, b.Pool)
	req.DryRun, req.Confirm = false, dry.Confirm
	_, err = svc.Requeue(ctx, admin.SourceInbox, req)
	require.ErrorIs(t, err, admin.ErrStale)
	require.ErrorContains(t, err, "the confirmation expired")
	require.Equal(t, before, admintest.Snapshot(t, b.Pool))

	now.Add(-int64(2 * time.Minute))
	res, err := svc.Requeue(ctx, admin.SourceInbox, req)
	require.NoError(t, err)
	require.Equal(t, []string{"d-orders-1", "d-orders-2"}, admintest.AffectedIDs(res))
}

// TestConfirmBindsTheReviewedOutboxEvents: the same for a requeue of dead
// outbox rows.
func TestConfirmBindsTheReviewedOutboxEvents(t *testing.T) {
	t.Parallel()
	b := admintest.Setup(t)
	admintest.OutboxRow(t, b.Pool, "o-1", "orders", "T", true, time.Hour, "broker down")
	admintest.OutboxRow(t, b.Pool, "o-2", "orders", "T", true, time.Hour, "broker down")
	admintest.OutboxRow(t, b.Pool, "o-3", "orders", "T", false, 0, "")
	ctx := context.Background()
	req := admin.RequeueRequest{Filter: admin.Filter{Topic: "orders"}, Actor: "ops", Reason: "broker back", DryRun: true}
	dry, err := b.Svc.Requeue(ctx, admin.SourceOutbox, req)
	require.NoError(t, err)
	require.Equal(t, []string{"o-1", "o-2"}, admintest.AffectedIDs(dry))
	_, err = b.Pool.Exec(ctx, `UPDATE pgrelay.outbox SET status = 'dead', last_error = 'late' WHERE event_id = 'o-3'`)
	require.NoError(t, err)
	before := admintest.SnapshotOutbox(t, b.Pool)
	req.DryRun, req.Confirm = false, dry.Confirm
	_, err = b.Svc.Requeue(ctx, admin.SourceOutbox, req)
	require.ErrorIs(t, err, admin.ErrStale)
	require.Equal(t, before, admintest.SnapshotOutbox(t, b.Pool), "nothing was requeued")
}

// TestConfirmBindsTheDatabase: two databases hold the same dead events; a
// dry run's confirmation on one does not purge the other's.
func TestConfirmBindsTheDatabase(t *testing.T) {
	t.Parallel()
	a, b := admintest.Setup(t), admintest.Setup(t)
	ctx := context.Background()
	svc := map[string]*admin.Service{}
	for name, bd := range map[string]*admintest.Bundle{"a": a, "b": b} {
		admintest.Fixtures(t, bd.Pool)
		s, err := admin.New(admin.Config{Pool: bd.Pool, Database: name})
		require.NoError(t, err)
		svc[name] = s
	}
	zero := time.Duration(0)
	req := admin.PurgeRequest{Filter: admin.Filter{Topic: "orders"}, OlderThan: &zero, Actor: "bob", Reason: "junk", DryRun: true}
	dry, err := svc["a"].Purge(ctx, admin.SourceInbox, req)
	require.NoError(t, err)
	require.Equal(t, []string{"d-orders-1", "d-orders-2"}, admintest.AffectedIDs(dry))
	before := admintest.Snapshot(t, b.Pool)
	req.DryRun, req.Confirm = false, dry.Confirm
	_, err = svc["b"].Purge(ctx, admin.SourceInbox, req)
	require.ErrorIs(t, err, admin.ErrStale)
	require.Equal(t, before, admintest.Snapshot(t, b.Pool), "nothing purged in b")
	_, err = svc["a"].Purge(ctx, admin.SourceInbox, req)
	require.NoError(t, err)
}
