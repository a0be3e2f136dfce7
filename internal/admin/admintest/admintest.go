// Package admintest holds the fixtures of the operator operations' tests:
// a migrated database with a Service, dead and live inbox and outbox rows,
// snapshots that prove nothing changed, and an HTTP client for the API.
package admintest

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/admin"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// Bundle is a fresh migrated database and a Service on it.
type Bundle struct {
	Pool *pgxpool.Pool
	Svc  *admin.Service
}

// Setup returns a Bundle for one test.
func Setup(t *testing.T) *Bundle {
	t.Helper()
	pool := testdb.New(t)
	svc, err := admin.New(admin.Config{Pool: pool, QueryTimeout: 10 * time.Second})
	require.NoError(t, err)
	return &Bundle{Pool: pool, Svc: svc}
}

// Row is an inbox fixture.
type Row struct {
	ID, Topic, Type, Status, LastError string
	Attempts                           int
	FinishedAgo                        time.Duration
}

// InsertRows inserts inbox rows (a dead or processed one finished
// FinishedAgo).
func InsertRows(t *testing.T, pool *pgxpool.Pool, rows ...Row) {
	t.Helper()
	ctx := context.Background()
	for _, r := range rows {
		var finished *time.Time
		if r.Status == "dead" || r.Status == "processed" {
			f := time.Now().Add(-r.FinishedAgo)
			finished = &f
		}
		var lastErr *string
		if r.LastError != "" {
			lastErr = &r.LastError
		}
		_, err := pool.Exec(ctx, `INSERT INTO pgrelay.inbox (event_id, topic, key, event_type, payload, status, attempts,
			last_error, finished_at, lock_version) VALUES ($1, $2, $1, $3, '{"n":1}', $4, $5, $6, $7, 7)`,
			r.ID, r.Topic, r.Type, r.Status, r.Attempts, lastErr, finished)
		require.NoError(t, err)
	}
}

// Snapshot returns every inbox and audit row as text, to prove that nothing
// changed.
func Snapshot(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var s string
	err := pool.QueryRow(context.Background(), `SELECT
		coalesce((SELECT string_agg(i::text, E'\n' ORDER BY event_id) FROM pgrelay.inbox i), '') || '|' ||
		coalesce((SELECT string_agg(a::text, E'\n' ORDER BY id) FROM pgrelay.replay_audit a), '')`).Scan(&s)
	require.NoError(t, err)
	return s
}

// StatusOf returns an inbox row's status, attempts and last error, or
// "absent".
func StatusOf(t *testing.T, pool *pgxpool.Pool, id string) (status string, attempts int, lastErr *string) {
	t.Helper()
	err := pool.QueryRow(context.Background(), `SELECT status, attempts, last_error FROM pgrelay.inbox WHERE event_id = $1`, id).
		Scan(&status, &attempts, &lastErr)
	if err != nil {
		return "absent", 0, nil
	}
	return status, attempts, lastErr
}

// Fixtures inserts three dead inbox events (orders and users, of different
// ages and errors), a processed and a pending one.
func Fixtures(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	InsertRows(t, pool,
		Row{ID: "d-orders-1", Topic: "orders", Type: "OrderPaid", Status: "dead", Attempts: 5, LastError: "Handler: Timeout talking to ledger", FinishedAgo: 48 * time.Hour},
		Row{ID: "d-orders-2", Topic: "orders", Type: "OrderCreated", Status: "dead", Attempts: 5, LastError: "bad payload: unexpected EOF", FinishedAgo: 2 * time.Hour},
		Row{ID: "d-users-1", Topic: "users", Type: "UserCreated", Status: "dead", Attempts: 3, LastError: "timeout", FinishedAgo: 72 * time.Hour},
		Row{ID: "p-orders-1", Topic: "orders", Type: "OrderPaid", Status: "processed", Attempts: 1, FinishedAgo: 96 * time.Hour},
		Row{ID: "q-orders-1", Topic: "orders", Type: "OrderPaid", Status: "pending"},
	)
}

// IDs returns the dead letters' event ids.
func IDs(list []admin.DeadLetter) []string {
	out := []string{}
	for _, d := range list {
		out = append(out, d.EventID)
	}
	return out
}

// AffectedIDs returns the event ids a requeue or purge touched.
func AffectedIDs(res *admin.Result) []string {
	out := []string{}
	for _, e := range res.Events {
		out = append(out, e.EventID)
	}
	return out
}

// OutboxRow inserts an outbox row as a producer would and, when dead is set,
// marks it dead as the relay does, deadAgo in the past.
func OutboxRow(t *testing.T, pool *pgxpool.Pool, id, topic, typ string, dead bool, deadAgo time.Duration, lastErr string) {
	t.Helper()
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO pgrelay.outbox (event_id, topic, key, event_type, payload) VALUES ($1, $2, $1, $3, '{"o":1}')`, id, topic, typ)
	require.NoError(t, err)
	if !dead {
		return
	}
	_, err = pool.Exec(ctx, `UPDATE pgrelay.outbox SET status = 'dead', attempts = attempts + 1, last_error = $2 WHERE event_id = $1`, id, lastErr)
	require.NoError(t, err)
	var deadAt *time.Time
	require.NoError(t, pool.QueryRow(ctx, `SELECT dead_at FROM pgrelay.outbox WHERE event_id = $1`, id).Scan(&deadAt))
	require.NotNil(t, deadAt, "the trigger records when a Row goes dead")
	require.WithinDuration(t, time.Now(), *deadAt, time.Minute)
	_, err = pool.Exec(ctx, `UPDATE pgrelay.outbox SET dead_at = now() - make_interval(secs => $2) WHERE event_id = $1`, id, deadAgo.Seconds())
	require.NoError(t, err)
}

// OutboxStatus returns an outbox row's status, or "absent".
func OutboxStatus(t *testing.T, pool *pgxpool.Pool, id string) string {
	t.Helper()
	var st string
	if err := pool.QueryRow(context.Background(), `SELECT status FROM pgrelay.outbox WHERE event_id = $1`, id).Scan(&st); err != nil {
		return "absent"
	}
	return st
}

// SnapshotOutbox returns every outbox and audit row as text.
func SnapshotOutbox(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var s string
	err := pool.QueryRow(context.Background(), `SELECT
		coalesce((SELECT string_agg(o::text, E'\n' ORDER BY id) FROM pgrelay.outbox o), '') || '|' ||
		coalesce((SELECT string_agg(a::text, E'\n' ORDER BY id) FROM pgrelay.replay_audit a), '')`).Scan(&s)
	require.NoError(t, err)
	return s
}

// ReceiveIDs receives OrderPaid events with the given ids for the handler
// "ledger".
func ReceiveIDs(t *testing.T, b *Bundle, ids ...string) {
	t.Helper()
	msgs := make([]pgrelay.Incoming, 0, len(ids))
	for _, id := range ids {
		msgs = append(msgs, pgrelay.Incoming{Message: pgrelay.Message{EventID: id, Topic: "orders", EventType: "OrderPaid"}})
	}
	_, err := pgrelay.ReceiveWith(context.Background(), b.Pool, msgs, pgrelay.ReceiveOptions{Targets: []pgrelay.Target{{Handler: "ledger"}}})
	require.NoError(t, err)
}

// Token is an admin API token long enough to be accepted.
const Token = "s3cret-token-0123456789"

// Do sends an HTTP request (body as JSON, bearer token when set) and
// returns the status and body.
func Do(t *testing.T, method, url, bearer string, body any) (int, []byte) {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		require.NoError(t, err)
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, r)
	require.NoError(t, err)
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, out
}
