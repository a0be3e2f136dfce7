package admin_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/admin"
	"github.com/pgrelay/pgrelay/internal/admin/admintest"
)

// TestRequeueOfAnInvalidTopicSaysPurgeIt: a dead outbox row kept from
// before migration 00095 with a topic the outbox no longer accepts cannot be
// requeued (it could never be published); the refusal is a bad request that
// says so and what to do, not a bare constraint violation, and changes
// nothing. Purging it works.
func TestRequeueOfAnInvalidTopicSaysPurgeIt(t *testing.T) {
	t.Parallel()
	b := admintest.Setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// A row from before the rule: stored with a valid topic, then given the
	// old one with the outbox's triggers off (they enforce the rule since
	// migration 00112).
	admintest.OutboxRow(t, b.Pool, "o-space", "orders-x", "OrderPaid", true, time.Hour, `nats: invalid subject "pgrelay.orders x"`)
	admintest.OutboxRow(t, b.Pool, "o-ok", "orders", "OrderPaid", true, time.Hour, "nats: no stream matches subject")
	require.NoError(t, pgx.BeginFunc(ctx, b.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE pgrelay.outbox SET topic = 'orders x' WHERE event_id = 'o-space'`)
		return err
	}))

	_, err := b.Svc.Requeue(ctx, admin.SourceOutbox, admin.RequeueRequest{All: true, Actor: "ops", Reason: "retry"})
	require.ErrorIs(t, err, admin.ErrInvalid)
	require.ErrorContains(t, err, `"orders x"`)
	require.ErrorContains(t, err, "purge")
	t.Log(err)
	require.Equal(t, "dead", admintest.OutboxStatus(t, b.Pool, "o-ok"), "nothing was requeued")

	zero := time.Duration(0)
	res, err := b.Svc.Purge(ctx, admin.SourceOutbox, admin.PurgeRequest{Filter: admin.Filter{EventID: "o-space"}, OlderThan: &zero, Actor: "ops"})
	require.NoError(t, err)
	require.Equal(t, 1, res.Count)
	_, err = b.Svc.Requeue(ctx, admin.SourceOutbox, admin.RequeueRequest{All: true, Actor: "ops", Reason: "retry"})
	require.NoError(t, err)
	require.Equal(t, "pending", admintest.OutboxStatus(t, b.Pool, "o-ok"))
}
