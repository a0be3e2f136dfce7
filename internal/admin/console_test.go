package admin_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/admin"
	"github.com/pgrelay/pgrelay/internal/admin/adminhttp"
	"github.com/pgrelay/pgrelay/internal/admin/admintest"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// TestDedupReportFromTheDatabase: the report's hit rate, hourly activity and
// feed come from what the receive statements recorded, with no consumer
// running, and reach the API as JSON.
func TestDedupReportFromTheDatabase(t *testing.T) {
	t.Parallel()
	b := admintest.Setup(t)
	admintest.ReceiveIDs(t, b, "e1", "e2", "e3")
	admintest.ReceiveIDs(t, b, "e1", "e4")
	admintest.ReceiveIDs(t, b, "e2", "e1")

	srv, err := adminhttp.NewServer(adminhttp.ServerConfig{Service: b.Svc, Addr: "127.0.0.1:0"})
	require.NoError(t, err)
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	code, body := admintest.Do(t, http.MethodGet, hs.URL+"/v1/dedup?recent=2", "", nil)
	require.Equal(t, http.StatusOK, code, string(body))
	var rep admin.DedupReport
	require.NoError(t, json.Unmarshal(body, &rep))
	require.Equal(t, int64(7), rep.Received)
	require.Equal(t, int64(3), rep.Duplicates)
	require.InDelta(t, 3.0/7, rep.HitRate, 1e-9)
	require.Len(t, rep.Hourly, 24)
	require.Equal(t, int64(7), rep.Hourly[23].Received, "the current hour is last")
	require.Equal(t, int64(3), rep.Hourly[23].Duplicates)
	require.Len(t, rep.Recent, 2, "recent caps the feed")
	require.Equal(t, int64(3), rep.RecordRows)
	require.Positive(t, rep.RecordBytes)
	for _, d := range rep.Recent {
		require.Contains(t, []string{"e1", "e2"}, d.EventID)
		require.Equal(t, "ledger", d.Handler)
		require.NotNil(t, d.OriginalReceivedAt)
		require.GreaterOrEqual(t, d.OriginalAgeSeconds, 0.0)
	}
}

// TestResetDedupStatsIsAudited: a reset empties the record and the counts and
// leaves an audit row naming the actor; without an actor it changes nothing.
func TestResetDedupStatsIsAudited(t *testing.T) {
	t.Parallel()
	b := admintest.Setup(t)
	admintest.ReceiveIDs(t, b, "e1")
	admintest.ReceiveIDs(t, b, "e1")
	ctx := context.Background()
	_, err := b.Svc.ResetDedupStats(ctx, "", "why")
	require.ErrorIs(t, err, admin.ErrInvalid)
	rep, err := b.Svc.Dedup(ctx, 0)
	require.NoError(t, err)
	require.Equal(t, int64(1), rep.Duplicates)

	id, err := b.Svc.ResetDedupStats(ctx, "tui:alice@host", "new baseline")
	require.NoError(t, err)
	rep, err = b.Svc.Dedup(ctx, 0)
	require.NoError(t, err)
	require.Zero(t, rep.Received)
	require.Zero(t, rep.RecordRows)
	audit, err := b.Svc.Audit(ctx, "*", admin.SourceInbox, 10)
	require.NoError(t, err)
	require.Len(t, audit, 1)
	require.Equal(t, id, audit[0].ID)
	require.Equal(t, "reset_dedup_stats", audit[0].Action)
	require.Equal(t, "tui:alice@host", audit[0].Actor)
	require.Equal(t, "new baseline", audit[0].Reason)
}

// TestInboxKeysAndOutboxOverview: recent keys list unprocessed events first,
// search finds any event by a part of its id, and the outbox overview lists
// every partition with its backlog and the relays by heartbeat.
func TestInboxKeysAndOutboxOverview(t *testing.T) {
	t.Parallel()
	b := admintest.Setup(t)
	admintest.Fixtures(t, b.Pool)
	ctx := context.Background()
	keys, err := b.Svc.InboxKeys(ctx, "", 0)
	require.NoError(t, err)
	require.Len(t, keys, 5)
	require.NotEqual(t, "processed", keys[0].Status)
	require.Equal(t, "processed", keys[4].Status)
	require.NotNil(t, keys[4].FinishedAt)
	keys, err = b.Svc.InboxKeys(ctx, "users", 0)
	require.NoError(t, err)
	require.Len(t, keys, 1)
	require.Equal(t, "d-users-1", keys[0].EventID)

	_, err = b.Pool.Exec(ctx, `INSERT INTO pgrelay.outbox (event_id, topic, key, event_type, payload) VALUES ('o1', 't', 'k1', 'T', '\x')`)
	require.NoError(t, err)
	_, err = b.Pool.Exec(ctx, `INSERT INTO pgrelay.relay_nodes (node_id, last_seen) VALUES ('relay-a', now()), ('relay-old', now() - interval '1 hour')`)
	require.NoError(t, err)
	_, err = b.Pool.Exec(ctx, `UPDATE pgrelay.relay_partitions SET owner = 'relay-a', epoch = 7, lease_until = now() + interval '1 minute'
		WHERE partition = pgrelay.outbox_partition('k1')`)
	require.NoError(t, err)
	ov, err := b.Svc.Outbox(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, ov.Partitions)
	var pending int64
	for _, p := range ov.Partitions {
		pending += p.Pending
		if p.Pending > 0 {
			require.Equal(t, "relay-a", p.Owner)
			require.Equal(t, int64(7), p.Epoch)
			require.True(t, p.Held)
			require.GreaterOrEqual(t, p.LagSeconds, 0.0)
		}
	}
	require.Equal(t, int64(1), pending)
	require.Len(t, ov.Relays, 2)
	require.True(t, ov.Relays[0].Alive)
	require.Equal(t, int32(1), ov.Relays[0].Partitions)
	require.False(t, ov.Relays[1].Alive)
}

// TestDedupReportHoursInAnyTimeZone: the hourly buckets line up with the
// report's hours whatever the session's time zone (a half-hour offset here).
func TestDedupReportHoursInAnyTimeZone(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig(testdb.NewURL(t))
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["timezone"] = "Asia/Kolkata"
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	svc, err := admin.New(admin.Config{Pool: pool})
	require.NoError(t, err)
	b := &admintest.Bundle{Pool: pool, Svc: svc}
	admintest.ReceiveIDs(t, b, "e1")
	admintest.ReceiveIDs(t, b, "e1")
	rep, err := svc.Dedup(context.Background(), 0)
	require.NoError(t, err)
	require.Equal(t, int64(2), rep.Received)
	require.Equal(t, int64(2), rep.Hourly[23].Received, "counted in the current hour")
}

// TestConsoleRoutes: the keys, partitions and reset routes answer JSON, and
// refuse bad parameters and a reset without an actor.
func TestConsoleRoutes(t *testing.T) {
	t.Parallel()
	b := admintest.Setup(t)
	admintest.Fixtures(t, b.Pool)
	srv, err := adminhttp.NewServer(adminhttp.ServerConfig{Service: b.Svc, Addr: "127.0.0.1:0"})
	require.NoError(t, err)
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()

	code, body := admintest.Do(t, http.MethodGet, hs.URL+"/v1/inbox/keys?search=users&limit=5", "", nil)
	require.Equal(t, http.StatusOK, code, string(body))
	var keys []admin.InboxKey
	require.NoError(t, json.Unmarshal(body, &keys))
	require.Len(t, keys, 1)
	code, _ = admintest.Do(t, http.MethodGet, hs.URL+"/v1/inbox/keys?limit=-1", "", nil)
	require.Equal(t, http.StatusBadRequest, code)
	code, _ = admintest.Do(t, http.MethodGet, hs.URL+"/v1/dedup?recent=x", "", nil)
	require.Equal(t, http.StatusBadRequest, code)

	code, body = admintest.Do(t, http.MethodGet, hs.URL+"/v1/outbox/partitions", "", nil)
	require.Equal(t, http.StatusOK, code, string(body))
	var ov admin.OutboxOverview
	require.NoError(t, json.Unmarshal(body, &ov))
	require.NotEmpty(t, ov.Partitions)

	code, _ = admintest.Do(t, http.MethodPost, hs.URL+"/v1/dedup/reset", "", map[string]string{"reason": "no actor"})
	require.Equal(t, http.StatusBadRequest, code)
	code, body = admintest.Do(t, http.MethodPost, hs.URL+"/v1/dedup/reset", "", map[string]string{"actor": "ops", "reason": "baseline"})
	require.Equal(t, http.StatusOK, code, string(body))
	audit, err := b.Svc.Audit(context.Background(), "*", admin.SourceInbox, 10)
	require.NoError(t, err)
	require.Len(t, audit, 1)
	require.Equal(t, "ops", audit[0].Actor)
}
