package admin_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/admin"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

type testBundle struct {
	pool *pgxpool.Pool
	svc  *admin.Service
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	pool := testdb.New(t)
	svc, err := admin.New(admin.Config{Pool: pool, QueryTimeout: 10 * time.Second})
	require.NoError(t, err)
	return &testBundle{pool: pool, svc: svc}
}

// row is an inbox fixture.
type row struct {
	id, topic, typ, status, lastError string
	attempts                          int
	finishedAgo                       time.Duration
}

func insertRows(t *testing.T, pool *pgxpool.Pool, rows ...row) {
	t.Helper()
	ctx := context.Background()
	for _, r := range rows {
		var finished *time.Time
		if r.status == "dead" || r.status == "processed" {
			f := time.Now().Add(-r.finishedAgo)
			finished = &f
		}
		var lastErr *string
		if r.lastError != "" {
			lastErr = &r.lastError
		}
		_, err := pool.Exec(ctx, `INSERT INTO inbox (event_id, topic, key, event_type, payload, status, attempts,
			last_error, finished_at, lock_version) VALUES ($1, $2, $1, $3, '{"n":1}', $4, $5, $6, $7, 7)`,
			r.id, r.topic, r.typ, r.status, r.attempts, lastErr, finished)
		require.NoError(t, err)
	}
}

// snapshot returns every inbox and audit row as text, to prove that nothing
// changed.
func snapshot(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var s string
	err := pool.QueryRow(context.Background(), `SELECT
		coalesce((SELECT string_agg(i::text, E'\n' ORDER BY event_id) FROM inbox i), '') || '|' ||
		coalesce((SELECT string_agg(a::text, E'\n' ORDER BY id) FROM replay_audit a), '')`).Scan(&s)
	require.NoError(t, err)
	return s
}

func statusOf(t *testing.T, pool *pgxpool.Pool, id string) (status string, attempts int, lastErr *string) {
	t.Helper()
	err := pool.QueryRow(context.Background(), `SELECT status, attempts, last_error FROM inbox WHERE event_id = $1`, id).
		Scan(&status, &attempts, &lastErr)
	if err != nil {
		return "absent", 0, nil
	}
	return status, attempts, lastErr
}

func fixtures(t *testing.T, pool *pgxpool.Pool) {
	insertRows(t, pool,
		row{id: "d-orders-1", topic: "orders", typ: "OrderPaid", status: "dead", attempts: 5, lastError: "Handler: Timeout talking to ledger", finishedAgo: 48 * time.Hour},
		row{id: "d-orders-2", topic: "orders", typ: "OrderCreated", status: "dead", attempts: 5, lastError: "bad payload: unexpected EOF", finishedAgo: 2 * time.Hour},
		row{id: "d-users-1", topic: "users", typ: "UserCreated", status: "dead", attempts: 3, lastError: "timeout", finishedAgo: 72 * time.Hour},
		row{id: "p-orders-1", topic: "orders", typ: "OrderPaid", status: "processed", attempts: 1, finishedAgo: 96 * time.Hour},
		row{id: "q-orders-1", topic: "orders", typ: "OrderPaid", status: "pending"},
	)
}

func ids(list []admin.DeadLetter) []string {
	out := []string{}
	for _, d := range list {
		out = append(out, d.EventID)
	}
	return out
}

func affectedIDs(res *admin.Result) []string {
	out := []string{}
	for _, e := range res.Events {
		out = append(out, e.EventID)
	}
	return out
}

func TestListDeadFilters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fixtures(t, b.pool)
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
		list, err := b.svc.ListDead(ctx, admin.SourceInbox, tc.f)
		require.NoError(t, err, tc.name)
		require.Equal(t, tc.want, ids(list), tc.name)
	}

	_, err := b.svc.ListDead(ctx, "nope", admin.Filter{})
	require.ErrorIs(t, err, admin.ErrInvalid)
	_, err = b.svc.ListDead(ctx, admin.SourceInbox, admin.Filter{DeadAfter: ago(time.Hour), DeadBefore: ago(2 * time.Hour)})
	require.ErrorIs(t, err, admin.ErrInvalid)
}

func TestShow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fixtures(t, b.pool)
	d, err := b.svc.Show(context.Background(), admin.SourceInbox, "d-orders-2", "")
	require.NoError(t, err)
	require.Equal(t, "dead", d.Status)
	require.Equal(t, `{"n":1}`, d.Payload)
	require.Equal(t, "text", d.PayloadEncoding)
	require.Equal(t, "bad payload: unexpected EOF", d.LastError)
	require.NotNil(t, d.DeadAt)

	_, err = b.svc.Show(context.Background(), admin.SourceInbox, "missing", "")
	require.ErrorIs(t, err, admin.ErrNotFound)
}

// TestRequeueByFilter: requeue moves exactly the selected dead events back to
// pending with the same event id and attempts reset, and audits each one.
func TestRequeueByFilter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fixtures(t, b.pool)
	ctx := context.Background()

	res, err := b.svc.Requeue(ctx, admin.SourceInbox, admin.RequeueRequest{
		Filter: admin.Filter{Topic: "orders", ErrorContains: "timeout"}, Actor: "alice", Reason: "ledger is back",
	})
	require.NoError(t, err)
	require.False(t, res.DryRun)
	require.Equal(t, 1, res.Count)
	require.Equal(t, []string{"d-orders-1"}, affectedIDs(res))
	require.Equal(t, int32(5), res.Events[0].PreviousAttempts)
	require.NotZero(t, res.Events[0].AuditID)

	st, attempts, lastErr := statusOf(t, b.pool, "d-orders-1")
	require.Equal(t, "pending", st)
	require.Equal(t, 0, attempts)
	require.Nil(t, lastErr)
	var lockVersion int64
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT lock_version FROM inbox WHERE event_id = 'd-orders-1'`).Scan(&lockVersion))
	require.Equal(t, int64(7), lockVersion, "the fencing version must never go back")
	for _, id := range []string{"d-orders-2", "d-users-1"} {
		st, _, _ := statusOf(t, b.pool, id)
		require.Equal(t, "dead", st, id)
	}

	audit, err := b.svc.Audit(ctx, "d-orders-1", "", 0)
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
	res, err = b.svc.Requeue(ctx, admin.SourceInbox, admin.RequeueRequest{Filter: admin.Filter{EventID: "d-orders-1"}, Actor: "alice", Reason: "again"})
	require.NoError(t, err)
	require.Equal(t, 0, res.Count)
}

func TestRequeueValidation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fixtures(t, b.pool)
	ctx := context.Background()
	before := snapshot(t, b.pool)
	for name, req := range map[string]admin.RequeueRequest{
		"empty filter without all": {Actor: "a", Reason: "r"},
		"no actor":                 {Filter: admin.Filter{EventID: "d-orders-1"}, Reason: "r"},
		"no reason":                {Filter: admin.Filter{EventID: "d-orders-1"}, Actor: "a"},
		"negative limit":           {Filter: admin.Filter{EventID: "d-orders-1", Limit: -1}, Actor: "a", Reason: "r"},
	} {
		_, err := b.svc.Requeue(ctx, admin.SourceInbox, req)
		require.ErrorIs(t, err, admin.ErrInvalid, name)
	}
	require.Equal(t, before, snapshot(t, b.pool))

	// --all requeues every dead letter, up to the limit.
	res, err := b.svc.Requeue(ctx, admin.SourceInbox, admin.RequeueRequest{All: true, Actor: "a", Reason: "r", Filter: admin.Filter{Limit: 2}})
	require.NoError(t, err)
	require.Equal(t, 2, res.Count)
	require.True(t, res.More)
}

// TestDryRunChangesNothing: a dry run reports exactly what the real operation
// then does, and leaves every row (inbox and audit) untouched.
func TestDryRunChangesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fixtures(t, b.pool)
	ctx := context.Background()
	before := snapshot(t, b.pool)

	dryReq, err := b.svc.Requeue(ctx, admin.SourceInbox, admin.RequeueRequest{Filter: admin.Filter{Topic: "orders"}, Actor: "a", Reason: "r", DryRun: true})
	require.NoError(t, err)
	require.True(t, dryReq.DryRun)
	require.Equal(t, []string{"d-orders-1", "d-orders-2"}, affectedIDs(dryReq))
	for _, e := range dryReq.Events {
		require.Zero(t, e.AuditID)
	}
	day := 24 * time.Hour
	dryPurge, err := b.svc.Purge(ctx, admin.SourceInbox, admin.PurgeRequest{OlderThan: &day, Actor: "a", DryRun: true})
	require.NoError(t, err)
	require.Equal(t, []string{"d-users-1", "d-orders-1"}, affectedIDs(dryPurge))
	require.Equal(t, before, snapshot(t, b.pool), "a dry run must change nothing")

	// The real operations do what the dry runs said.
	realPurge, err := b.svc.Purge(ctx, admin.SourceInbox, admin.PurgeRequest{OlderThan: &day, Actor: "a"})
	require.NoError(t, err)
	require.Equal(t, affectedIDs(dryPurge), affectedIDs(realPurge))
	require.NotEqual(t, before, snapshot(t, b.pool))
}

// TestPurgeRemovesOnlyWhatItSays: purge deletes dead events older than the
// cut-off that match the filter, and nothing else (not younger dead events,
// not processed or pending rows however old), and audits each deletion.
func TestPurgeRemovesOnlyWhatItSays(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fixtures(t, b.pool)
	insertRows(t, b.pool, row{id: "d-orders-3", topic: "orders", typ: "OrderPaid", status: "dead", attempts: 1, lastError: "x", finishedAgo: 30 * time.Hour})
	ctx := context.Background()

	day := 24 * time.Hour
	res, err := b.svc.Purge(ctx, admin.SourceInbox, admin.PurgeRequest{Filter: admin.Filter{Topic: "orders"}, OlderThan: &day, Actor: "bob", Reason: "cleanup"})
	require.NoError(t, err)
	require.Equal(t, []string{"d-orders-1", "d-orders-3"}, affectedIDs(res))

	want := map[string]string{
		"d-orders-1": "absent", "d-orders-3": "absent",
		"d-orders-2": "dead",      // younger than a day
		"d-users-1":  "dead",      // another topic
		"p-orders-1": "processed", // not dead, older than a day
		"q-orders-1": "pending",
	}
	for id, status := range want {
		got, _, _ := statusOf(t, b.pool, id)
		require.Equal(t, status, got, id)
	}
	audit, err := b.svc.Audit(ctx, "", admin.SourceInbox, 0)
	require.NoError(t, err)
	require.Len(t, audit, 2)
	for _, a := range audit {
		require.Equal(t, "purge", a.Action)
		require.Equal(t, "bob", a.Actor)
	}

	_, err = b.svc.Purge(ctx, admin.SourceInbox, admin.PurgeRequest{Actor: "bob"})
	require.ErrorIs(t, err, admin.ErrInvalid, "older_than is required")
	neg := -time.Hour
	_, err = b.svc.Purge(ctx, admin.SourceInbox, admin.PurgeRequest{Actor: "bob", OlderThan: &neg})
	require.ErrorIs(t, err, admin.ErrInvalid)
}

func TestStats(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fixtures(t, b.pool)
	// A row backing off is pending but not claimable.
	_, err := b.pool.Exec(context.Background(), `INSERT INTO inbox (event_id, received_at, next_attempt_at)
		VALUES ('backing-off', now() - interval '1 hour', now() + interval '1 hour')`)
	require.NoError(t, err)
	_, err = b.pool.Exec(context.Background(), `UPDATE inbox SET received_at = now() - interval '10 minutes',
		next_attempt_at = now() - interval '5 minutes' WHERE event_id = 'q-orders-1'`)
	require.NoError(t, err)

	svc, err := admin.New(admin.Config{Pool: b.pool, Counters: func() (float64, float64, bool) { return 200, 50, true }})
	require.NoError(t, err)
	st, err := svc.Stats(context.Background())
	require.NoError(t, err)
	require.Equal(t, map[string]int64{"pending": 2, "processing": 0, "processed": 1, "dead": 3}, st.Inbox.ByStatus)
	require.Positive(t, st.Inbox.TableBytes)
	require.Positive(t, st.AuditTableBytes)
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

// outboxRow inserts an outbox row as a producer would and, when dead is set,
// marks it dead as the relay does, deadAgo in the past.
func outboxRow(t *testing.T, pool *pgxpool.Pool, id, topic, typ string, dead bool, deadAgo time.Duration, lastErr string) {
	t.Helper()
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO outbox (event_id, topic, key, event_type, payload) VALUES ($1, $2, $1, $3, '{"o":1}')`, id, topic, typ)
	require.NoError(t, err)
	if !dead {
		return
	}
	_, err = pool.Exec(ctx, `UPDATE outbox SET status = 'dead', attempts = attempts + 1, last_error = $2 WHERE event_id = $1`, id, lastErr)
	require.NoError(t, err)
	var deadAt *time.Time
	require.NoError(t, pool.QueryRow(ctx, `SELECT dead_at FROM outbox WHERE event_id = $1`, id).Scan(&deadAt))
	require.NotNil(t, deadAt, "the trigger records when a row goes dead")
	require.WithinDuration(t, time.Now(), *deadAt, time.Minute)
	_, err = pool.Exec(ctx, `UPDATE outbox SET dead_at = now() - make_interval(secs => $2) WHERE event_id = $1`, id, deadAgo.Seconds())
	require.NoError(t, err)
}

func outboxStatus(t *testing.T, pool *pgxpool.Pool, id string) string {
	t.Helper()
	var st string
	if err := pool.QueryRow(context.Background(), `SELECT status FROM outbox WHERE event_id = $1`, id).Scan(&st); err != nil {
		return "absent"
	}
	return st
}

// TestOutboxDeadLetters: the outbox's dead letters are listed, shown,
// requeued (dry run first) and purged with the inbox's semantics, and audited
// with source outbox.
func TestOutboxDeadLetters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	outboxRow(t, b.pool, "o-old", "orders", "OrderPaid", true, 48*time.Hour, "nats: maximum payload exceeded")
	outboxRow(t, b.pool, "o-new", "orders", "OrderCreated", true, time.Hour, "nats: no stream matches subject")
	outboxRow(t, b.pool, "o-live", "orders", "OrderPaid", false, 0, "")

	list, err := b.svc.ListDead(ctx, admin.SourceOutbox, admin.Filter{})
	require.NoError(t, err)
	require.Equal(t, []string{"o-old", "o-new"}, ids(list))
	list, err = b.svc.ListDead(ctx, admin.SourceOutbox, admin.Filter{ErrorContains: "STREAM"})
	require.NoError(t, err)
	require.Equal(t, []string{"o-new"}, ids(list))
	require.NotZero(t, list[0].ID)

	d, err := b.svc.Show(ctx, admin.SourceOutbox, "o-old", "")
	require.NoError(t, err)
	require.Equal(t, "dead", d.Status)
	require.Equal(t, `{"o":1}`, d.Payload)
	require.WithinDuration(t, time.Now().Add(-48*time.Hour), *d.DeadAt, time.Minute)

	before := snapshotOutbox(t, b.pool)
	res, err := b.svc.Requeue(ctx, admin.SourceOutbox, admin.RequeueRequest{Filter: admin.Filter{EventID: "o-new"}, Actor: "ops", Reason: "stream created", DryRun: true})
	require.NoError(t, err)
	require.Equal(t, []string{"o-new"}, affectedIDs(res))
	require.Equal(t, before, snapshotOutbox(t, b.pool), "a dry run changes nothing")

	res, err = b.svc.Requeue(ctx, admin.SourceOutbox, admin.RequeueRequest{Filter: admin.Filter{EventID: "o-new"}, Actor: "ops", Reason: "stream created"})
	require.NoError(t, err)
	require.Equal(t, 1, res.Count)
	var attempts int
	var lastErr *string
	var deadAt *time.Time
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT attempts, last_error, dead_at FROM outbox WHERE event_id = 'o-new' AND status = 'pending'`).
		Scan(&attempts, &lastErr, &deadAt))
	require.Zero(t, attempts)
	require.Nil(t, lastErr)
	require.Nil(t, deadAt)

	day := 24 * time.Hour
	res, err = b.svc.Purge(ctx, admin.SourceOutbox, admin.PurgeRequest{OlderThan: &day, Actor: "ops"})
	require.NoError(t, err)
	require.Equal(t, []string{"o-old"}, affectedIDs(res))
	require.Equal(t, "absent", outboxStatus(t, b.pool, "o-old"))
	require.Equal(t, "pending", outboxStatus(t, b.pool, "o-new"))
	require.Equal(t, "pending", outboxStatus(t, b.pool, "o-live"))

	audit, err := b.svc.Audit(ctx, "", admin.SourceOutbox, 0)
	require.NoError(t, err)
	require.Len(t, audit, 2)
	require.Equal(t, "purge", audit[0].Action)
	require.Equal(t, "requeue", audit[1].Action)
	require.Equal(t, "nats: no stream matches subject", audit[1].PreviousError)

	st, err := b.svc.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, map[string]int64{"pending": 2, "published": 0, "dead": 0}, st.Outbox.ByStatus)
	require.Positive(t, st.Outbox.TableBytes)
}

func snapshotOutbox(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var s string
	err := pool.QueryRow(context.Background(), `SELECT
		coalesce((SELECT string_agg(o::text, E'\n' ORDER BY id) FROM outbox o), '') || '|' ||
		coalesce((SELECT string_agg(a::text, E'\n' ORDER BY id) FROM replay_audit a), '')`).Scan(&s)
	require.NoError(t, err)
	return s
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
	insertRows(t, pool,
		row{id: "d-young", topic: "orders", typ: "OrderPaid", status: "dead", attempts: 1, lastError: "x", finishedAgo: time.Hour},
		row{id: "d-old", topic: "orders", typ: "OrderPaid", status: "dead", attempts: 1, lastError: "x", finishedAgo: 30 * time.Hour},
	)
	day := 24 * time.Hour
	res, err := svc.Purge(context.Background(), admin.SourceInbox, admin.PurgeRequest{OlderThan: &day, Actor: "ops"})
	require.NoError(t, err)
	require.Equal(t, []string{"d-old"}, affectedIDs(res))
	got, _, _ := statusOf(t, pool, "d-young")
	require.Equal(t, "dead", got, "dead for an hour by the database's clock")
}
