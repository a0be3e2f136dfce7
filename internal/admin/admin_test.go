package admin_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/admin"
	"github.com/pgrelay/pgrelay/internal/admin/admintest"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

func TestListDeadFilters(t *testing.T) {
	t.Parallel()
	b := admintest.Setup(t)
	admintest.Fixtures(t, b.Pool)
	ctx := context.Background()
	ago := func(d time.Duration) *time.Time { x := time.Now().Add(-d); return &x }

	for _, tc := range []struct {
		name string
		f    admin.Filter
		want []string
	}{
		{"all dead, oldest first", admin.Filter{}, []string{"d-users-1", "d-orders-1", "d-orders-2"}},
		{"topic", admin.Filter{Topic: "orders"}, []string{"d-orders-1", "d-orders-2"}},
		{"type", admin.Filter{EventType: "OrderCreated"}, []string{"d-orders-2"}},
		{"error substring ignores case", admin.Filter{ErrorContains: "TIMEOUT"}, []string{"d-users-1", "d-orders-1"}},
		{"time range", admin.Filter{DeadAfter: ago(60 * time.Hour), DeadBefore: ago(24 * time.Hour)}, []string{"d-orders-1"}},
		{"event id", admin.Filter{EventID: "d-orders-2"}, []string{"d-orders-2"}},
		{"limit", admin.Filter{Limit: 1}, []string{"d-users-1"}},
		{"no match", admin.Filter{Topic: "nope"}, []string{}},
	} {
		list, err := b.Svc.ListDead(ctx, admin.SourceInbox, tc.f)
		require.NoError(t, err, tc.name)
		require.Equal(t, tc.want, admintest.IDs(list), tc.name)
	}

	_, err := b.Svc.ListDead(ctx, "nope", admin.Filter{})
	require.ErrorIs(t, err, admin.ErrInvalid)
	_, err = b.Svc.ListDead(ctx, admin.SourceInbox, admin.Filter{DeadAfter: ago(time.Hour), DeadBefore: ago(2 * time.Hour)})
	require.ErrorIs(t, err, admin.ErrInvalid)
}

func TestShow(t *testing.T) {
	t.Parallel()
	b := admintest.Setup(t)
	admintest.Fixtures(t, b.Pool)
	d, err := b.Svc.Show(context.Background(), admin.SourceInbox, "d-orders-2", "")
	require.NoError(t, err)
	require.Equal(t, "dead", d.Status)
	require.Equal(t, `{"n":1}`, d.Payload)
	require.Equal(t, "text", d.PayloadEncoding)
	require.Equal(t, "bad payload: unexpected EOF", d.LastError)
	require.NotNil(t, d.DeadAt)

	_, err = b.Svc.Show(context.Background(), admin.SourceInbox, "missing", "")
	require.ErrorIs(t, err, admin.ErrNotFound)
}

// TestRequeueByFilter: requeue moves exactly the selected dead events back to
// pending with the same event id and attempts reset, and audits each one.
func TestRequeueByFilter(t *testing.T) {
	t.Parallel()
	b := admintest.Setup(t)
	admintest.Fixtures(t, b.Pool)
	ctx := context.Background()

	res, err := b.Svc.Requeue(ctx, admin.SourceInbox, admin.RequeueRequest{
		Filter: admin.Filter{Topic: "orders", ErrorContains: "timeout"}, Actor: "alice", Reason: "ledger is back",
	})
	require.NoError(t, err)
	require.False(t, res.DryRun)
	require.Equal(t, 1, res.Count)
	require.Equal(t, []string{"d-orders-1"}, admintest.AffectedIDs(res))
	require.Equal(t, int32(5), res.Events[0].PreviousAttempts)
	require.NotZero(t, res.Events[0].AuditID)

	st, attempts, lastErr := admintest.StatusOf(t, b.Pool, "d-orders-1")
	require.Equal(t, "pending", st)
	require.Equal(t, 0, attempts)
	require.Nil(t, lastErr)
	var lockVersion int64
	require.NoError(t, b.Pool.QueryRow(ctx, `SELECT lock_version FROM pgrelay.inbox WHERE event_id = 'd-orders-1'`).Scan(&lockVersion))
	require.Equal(t, int64(7), lockVersion, "the fencing version must never go back")
	for _, id := range []string{"d-orders-2", "d-users-1"} {
		st, _, _ := admintest.StatusOf(t, b.Pool, id)
		require.Equal(t, "dead", st, id)
	}

	audit, err := b.Svc.Audit(ctx, "d-orders-1", "", 0)
	require.NoError(t, err)
	require.Len(t, audit, 1)
	require.Equal(t, "requeue", audit[0].Action)
	require.Equal(t, "inbox", audit[0].Source)
	require.Equal(t, "alice", audit[0].Actor)
	require.Equal(t, "ledger is back", audit[0].Reason)
	require.Equal(t, int32(5), audit[0].PreviousAttempts)
	require.Equal(t, "Handler: Timeout talking to ledger", audit[0].PreviousError)
	require.WithinDuration(t, time.Now(), audit[0].At, time.Minute)

	// Requeueing again finds nothing: the event is no longer dead.
	res, err = b.Svc.Requeue(ctx, admin.SourceInbox, admin.RequeueRequest{Filter: admin.Filter{EventID: "d-orders-1"}, Actor: "alice", Reason: "again"})
	require.NoError(t, err)
	require.Equal(t, 0, res.Count)
}

func TestRequeueValidation(t *testing.T) {
	t.Parallel()
	b := admintest.Setup(t)
	admintest.Fixtures(t, b.Pool)
	ctx := context.Background()
	before := admintest.Snapshot(t, b.Pool)
	for name, req := range map[string]admin.RequeueRequest{
		"empty filter without all": {Actor: "a", Reason: "r"},
		"no actor":                 {Filter: admin.Filter{EventID: "d-orders-1"}, Reason: "r"},
		"no reason":                {Filter: admin.Filter{EventID: "d-orders-1"}, Actor: "a"},
		"negative limit":           {Filter: admin.Filter{EventID: "d-orders-1", Limit: -1}, Actor: "a", Reason: "r"},
	} {
		_, err := b.Svc.Requeue(ctx, admin.SourceInbox, req)
		require.ErrorIs(t, err, admin.ErrInvalid, name)
	}
	require.Equal(t, before, admintest.Snapshot(t, b.Pool))

	// --all requeues every dead letter, up to the limit.
	res, err := b.Svc.Requeue(ctx, admin.SourceInbox, admin.RequeueRequest{All: true, Actor: "a", Reason: "r", Filter: admin.Filter{Limit: 2}})
	require.NoError(t, err)
	require.Equal(t, 2, res.Count)
	require.True(t, res.More)
}

// TestDryRunChangesNothing: a dry run reports exactly what the real operation
// then does, and leaves every row (inbox and audit) untouched.
func TestDryRunChangesNothing(t *testing.T) {
	t.Parallel()
	b := admintest.Setup(t)
	admintest.Fixtures(t, b.Pool)
	ctx := context.Background()
	before := admintest.Snapshot(t, b.Pool)

	dryReq, err := b.Svc.Requeue(ctx, admin.SourceInbox, admin.RequeueRequest{Filter: admin.Filter{Topic: "orders"}, Actor: "a", Reason: "r", DryRun: true})
	require.NoError(t, err)
	require.True(t, dryReq.DryRun)
	require.Equal(t, []string{"d-orders-1", "d-orders-2"}, admintest.AffectedIDs(dryReq))
	for _, e := range dryReq.Events {
		require.Zero(t, e.AuditID)
	}
	day := 24 * time.Hour
	dryPurge, err := b.Svc.Purge(ctx, admin.SourceInbox, admin.PurgeRequest{OlderThan: &day, Actor: "a", DryRun: true})
	require.NoError(t, err)
	require.Equal(t, []string{"d-users-1", "d-orders-1"}, admintest.AffectedIDs(dryPurge))
	require.Equal(t, before, admintest.Snapshot(t, b.Pool), "a dry run must change nothing")

	// The real operations do what the dry runs said.
	realPurge, err := b.Svc.Purge(ctx, admin.SourceInbox, admin.PurgeRequest{OlderThan: &day, Actor: "a"})
	require.NoError(t, err)
	require.Equal(t, admintest.AffectedIDs(dryPurge), admintest.AffectedIDs(realPurge))
	require.NotEqual(t, before, admintest.Snapshot(t, b.Pool))
}

// TestPurgeRemovesOnlyWhatItSays: purge deletes dead events older than the
// cut-off that match the filter, and nothing else (not younger dead events,
// not processed or pending rows however old), and audits each deletion.
func TestPurgeRemovesOnlyWhatItSays(t *testing.T) {
	t.Parallel()
	b := admintest.Setup(t)
	admintest.Fixtures(t, b.Pool)
	admintest.InsertRows(t, b.Pool, admintest.Row{ID: "d-orders-3", Topic: "orders", Type: "OrderPaid", Status: "dead", Attempts: 1, LastError: "x", FinishedAgo: 30 * time.Hour})
	ctx := context.Background()

	day := 24 * time.Hour
	res, err := b.Svc.Purge(ctx, admin.SourceInbox, admin.PurgeRequest{Filter: admin.Filter{Topic: "orders"}, OlderThan: &day, Actor: "bob", Reason: "cleanup"})
	require.NoError(t, err)
	require.Equal(t, []string{"d-orders-1", "d-orders-3"}, admintest.AffectedIDs(res))

	want := map[string]string{
		"d-orders-1": "absent", "d-orders-3": "absent",
		"d-orders-2": "dead",      // younger than a day
		"d-users-1":  "dead",      // another topic
		"p-orders-1": "processed", // not dead, older than a day
		"q-orders-1": "pending",
	}
	for id, status := range want {
		got, _, _ := admintest.StatusOf(t, b.Pool, id)
		require.Equal(t, status, got, id)
	}
	audit, err := b.Svc.Audit(ctx, "", admin.SourceInbox, 0)
	require.NoError(t, err)
	require.Len(t, audit, 2)
	for _, a := range audit {
		require.Equal(t, "purge", a.Action)
		require.Equal(t, "bob", a.Actor)
	}

	_, err = b.Svc.Purge(ctx, admin.SourceInbox, admin.PurgeRequest{Actor: "bob"})
	require.ErrorIs(t, err, admin.ErrInvalid, "older_than is required")
	neg := -time.Hour
	_, err = b.Svc.Purge(ctx, admin.SourceInbox, admin.PurgeRequest{Actor: "bob", OlderThan: &neg})
	require.ErrorIs(t, err, admin.ErrInvalid)
}

func TestStats(t *testing.T) {
	t.Parallel()
	b := admintest.Setup(t)
	admintest.Fixtures(t, b.Pool)
	// A row backing off is pending but not claimable.
	_, err := b.Pool.Exec(context.Background(), `INSERT INTO pgrelay.inbox (event_id, received_at, next_attempt_at)
		VALUES ('backing-off', now() - interval '1 hour', now() + interval '1 hour')`)
	require.NoError(t, err)
	_, err = b.Pool.Exec(context.Background(), `UPDATE pgrelay.inbox SET received_at = now() - interval '10 minutes',
		next_attempt_at = now() - interval '5 minutes' WHERE event_id = 'q-orders-1'`)
	require.NoError(t, err)

	svc, err := admin.New(admin.Config{Pool: b.Pool, Counters: func() (float64, float64, bool) { return 200, 50, true }})
	require.NoError(t, err)
	st, err := svc.Stats(context.Background())
	require.NoError(t, err)
	require.Equal(t, map[string]int64{"pending": 2, "processing": 0, "processed": 1, "dead": 3}, st.Inbox.ByStatus)
	require.Positive(t, st.Inbox.TableBytes)
	require.Positive(t, st.AuditTableBytes)
	require.Positive(t, st.Schema.Latest)
	require.Equal(t, st.Schema.Latest, st.Schema.Current, "a fully migrated database")
	require.False(t, st.Schema.Behind())
	require.InDelta(t, 3600, st.Inbox.OldestPendingSeconds, 60)
	require.InDelta(t, 300, st.Inbox.OldestClaimableSeconds, 60, "a row backing off is not claimable")
	require.NotNil(t, st.Dedup)
	require.InDelta(t, 0.25, st.Dedup.HitRate, 1e-9)
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	_, err := admin.New(admin.Config{})
	require.ErrorContains(t, err, "Config.Pool")
	pool := &pgxpool.Pool{}
	_, err = admin.New(admin.Config{Pool: pool, QueryTimeout: -time.Second})
	require.ErrorContains(t, err, "Config.QueryTimeout")
	_, err = admin.New(admin.Config{Pool: pool, MaxRows: -1})
	require.ErrorContains(t, err, "Config.MaxRows")
}

// TestOutboxDeadLetters: the outbox's dead letters are listed, shown,
// requeued (dry run first) and purged with the inbox's semantics, and audited
// with source outbox.
func TestOutboxDeadLetters(t *testing.T) {
	t.Parallel()
	b := admintest.Setup(t)
	ctx := context.Background()
	admintest.OutboxRow(t, b.Pool, "o-old", "orders", "OrderPaid", true, 48*time.Hour, "nats: maximum payload exceeded")
	admintest.OutboxRow(t, b.Pool, "o-new", "orders", "OrderCreated", true, time.Hour, "nats: no stream matches subject")
	admintest.OutboxRow(t, b.Pool, "o-live", "orders", "OrderPaid", false, 0, "")

	list, err := b.Svc.ListDead(ctx, admin.SourceOutbox, admin.Filter{})
	require.NoError(t, err)
	require.Equal(t, []string{"o-old", "o-new"}, admintest.IDs(list))
	list, err = b.Svc.ListDead(ctx, admin.SourceOutbox, admin.Filter{ErrorContains: "STREAM"})
	require.NoError(t, err)
	require.Equal(t, []string{"o-new"}, admintest.IDs(list))
	require.NotZero(t, list[0].ID)

	d, err := b.Svc.Show(ctx, admin.SourceOutbox, "o-old", "")
	require.NoError(t, err)
	require.Equal(t, "dead", d.Status)
	require.Equal(t, `{"o":1}`, d.Payload)
	require.WithinDuration(t, time.Now().Add(-48*time.Hour), *d.DeadAt, time.Minute)

	before := admintest.SnapshotOutbox(t, b.Pool)
	res, err := b.Svc.Requeue(ctx, admin.SourceOutbox, admin.RequeueRequest{Filter: admin.Filter{EventID: "o-new"}, Actor: "ops", Reason: "stream created", DryRun: true})
	require.NoError(t, err)
	require.Equal(t, []string{"o-new"}, admintest.AffectedIDs(res))
	require.Equal(t, before, admintest.SnapshotOutbox(t, b.Pool), "a dry run changes nothing")

	res, err = b.Svc.Requeue(ctx, admin.SourceOutbox, admin.RequeueRequest{Filter: admin.Filter{EventID: "o-new"}, Actor: "ops", Reason: "stream created"})
	require.NoError(t, err)
	require.Equal(t, 1, res.Count)
	var attempts int
	var lastErr *string
	var deadAt *time.Time
	require.NoError(t, b.Pool.QueryRow(ctx, `SELECT attempts, last_error, dead_at FROM pgrelay.outbox WHERE event_id = 'o-new' AND status = 'pending'`).
		Scan(&attempts, &lastErr, &deadAt))
	require.Zero(t, attempts)
	require.Nil(t, lastErr)
	require.Nil(t, deadAt)

	day := 24 * time.Hour
	res, err = b.Svc.Purge(ctx, admin.SourceOutbox, admin.PurgeRequest{OlderThan: &day, Actor: "ops"})
	require.NoError(t, err)
	require.Equal(t, []string{"o-old"}, admintest.AffectedIDs(res))
	require.Equal(t, "absent", admintest.OutboxStatus(t, b.Pool, "o-old"))
	require.Equal(t, "pending", admintest.OutboxStatus(t, b.Pool, "o-new"))
	require.Equal(t, "pending", admintest.OutboxStatus(t, b.Pool, "o-live"))

	audit, err := b.Svc.Audit(ctx, "", admin.SourceOutbox, 0)
	require.NoError(t, err)
	require.Len(t, audit, 2)
	require.Equal(t, "purge", audit[0].Action)
	require.Equal(t, "requeue", audit[1].Action)
	require.Equal(t, "nats: no stream matches subject", audit[1].PreviousError)

	st, err := b.Svc.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, map[string]int64{"pending": 2, "published": 0, "dead": 0}, st.Outbox.ByStatus)
	require.Positive(t, st.Outbox.TableBytes)
}

// TestPurgeCutoffUsesTheDatabaseClock: the older_than cut-off is measured with
// the database's clock, which wrote the dead letters' times. A client whose
// clock runs two days fast purges nothing younger than the cut-off.
func TestPurgeCutoffUsesTheDatabaseClock(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	fast := func() time.Time { return time.Now().Add(48 * time.Hour) }
	svc, err := admin.New(admin.Config{Pool: pool, QueryTimeout: 10 * time.Second, Now: fast})
	require.NoError(t, err)
	admintest.InsertRows(t, pool,
		admintest.Row{ID: "d-young", Topic: "orders", Type: "OrderPaid", Status: "dead", Attempts: 1, LastError: "x", FinishedAgo: time.Hour},
		admintest.Row{ID: "d-old", Topic: "orders", Type: "OrderPaid", Status: "dead", Attempts: 1, LastError: "x", FinishedAgo: 30 * time.Hour},
	)
	day := 24 * time.Hour
	res, err := svc.Purge(context.Background(), admin.SourceInbox, admin.PurgeRequest{OlderThan: &day, Actor: "ops"})
	require.NoError(t, err)
	require.Equal(t, []string{"d-old"}, admintest.AffectedIDs(res))
	got, _, _ := admintest.StatusOf(t, pool, "d-young")
	require.Equal(t, "dead", got, "dead for an hour by the database's clock")
}
