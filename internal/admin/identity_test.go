package admin_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/admin"
	"github.com/pgrelay/pgrelay/internal/admin/adminhttp"
	"github.com/pgrelay/pgrelay/internal/admin/admintest"
)

// TestHandlersInOperations: dead letters, show, requeue, purge and stats name
// the handler and filter by it, and the conflicts a Receive recorded are
// listed through the service and GET /v1/inbox/conflicts.
func TestHandlersInOperations(t *testing.T) {
	t.Parallel()
	b := admintest.Setup(t)
	ctx := context.Background()
	_, err := b.Pool.Exec(ctx, `INSERT INTO pgrelay.inbox (handler, event_id, status, attempts, last_error, finished_at) VALUES
		('ledger', 'e1', 'dead', 3, 'ledger down', now()), ('mail', 'e1', 'dead', 2, 'smtp down', now()),
		('mail', 'e2', 'processed', 1, NULL, now())`)
	require.NoError(t, err)

	all, err := b.Svc.ListDead(ctx, admin.SourceInbox, admin.Filter{})
	require.NoError(t, err)
	require.Len(t, all, 2)
	mail, err := b.Svc.ListDead(ctx, admin.SourceInbox, admin.Filter{Handler: "mail"})
	require.NoError(t, err)
	require.Len(t, mail, 1)
	require.Equal(t, "mail", mail[0].Handler)
	require.Equal(t, "smtp down", mail[0].LastError)
	_, err = b.Svc.ListDead(ctx, admin.SourceOutbox, admin.Filter{Handler: "mail"})
	require.ErrorIs(t, err, admin.ErrInvalid)

	d, err := b.Svc.Show(ctx, admin.SourceInbox, "e1", "")
	require.NoError(t, err)
	require.Equal(t, "ledger", d.Handler)
	require.Equal(t, []string{"mail"}, d.OtherHandlers)
	d, err = b.Svc.Show(ctx, admin.SourceInbox, "e1", "mail")
	require.NoError(t, err)
	require.Equal(t, "smtp down", d.LastError)
	require.Equal(t, "e1", d.DedupKey)
	_, err = b.Svc.Show(ctx, admin.SourceInbox, "e2", "ledger")
	require.ErrorIs(t, err, admin.ErrNotFound)

	res, err := b.Svc.Requeue(ctx, admin.SourceInbox, admin.RequeueRequest{Filter: admin.Filter{Handler: "mail"}, Actor: "op", Reason: "smtp back"})
	require.NoError(t, err)
	require.Len(t, res.Events, 1)
	require.Equal(t, "mail", res.Events[0].Handler)
	var ledgerStatus, mailStatus string
	require.NoError(t, b.Pool.QueryRow(ctx, `SELECT
		(SELECT status FROM pgrelay.inbox WHERE handler = 'ledger' AND event_id = 'e1'),
		(SELECT status FROM pgrelay.inbox WHERE handler = 'mail' AND event_id = 'e1')`).Scan(&ledgerStatus, &mailStatus))
	require.Equal(t, "dead", ledgerStatus, "another handler's dead letter is left alone")
	require.Equal(t, "pending", mailStatus)
	audit, err := b.Svc.Audit(ctx, "e1", admin.SourceInbox, 0)
	require.NoError(t, err)
	require.Len(t, audit, 1)
	require.Equal(t, "mail", audit[0].Handler, "the audit trail names the handler whose row was requeued")

	st, err := b.Svc.Stats(ctx)
	require.NoError(t, err)
	require.Len(t, st.Inbox.Handlers, 2)
	require.Equal(t, "ledger", st.Inbox.Handlers[0].Handler)
	require.Equal(t, int64(1), st.Inbox.Handlers[0].ByStatus["dead"])
	require.Equal(t, int64(1), st.Inbox.Handlers[1].ByStatus["pending"])
	require.Equal(t, int64(1), st.Inbox.Handlers[1].ByStatus["processed"])
	require.Equal(t, []string{"message-id"}, st.Inbox.Handlers[1].KeyStrategies)

	targets := []pgrelay.Target{{Handler: "pay", DedupKey: "business:pay:{order_id}"}}
	for _, p := range []string{`{"order_id":"o1","n":1}`, `{"order_id":"o1","n":2}`} {
		_, err := pgrelay.ReceiveFor(ctx, b.Pool, targets, []pgrelay.Incoming{{Message: pgrelay.Message{
			EventID: "x" + p[len(p)-2:len(p)-1], EventType: "Pay", Payload: []byte(p)}}})
		require.NoError(t, err)
	}
	list, err := b.Svc.ListConflicts(ctx, "pay", "", 0)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, "x1", list[0].StoredEventID)
	require.Equal(t, "x2", list[0].EventID)
	require.Equal(t, "pay:o1", list[0].DedupKey)
	require.Equal(t, "business:pay:{order_id}", list[0].KeyStrategy)

	srv, err := adminhttp.NewServer(adminhttp.ServerConfig{Service: b.Svc, Addr: "127.0.0.1:0"})
	require.NoError(t, err)
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	code, body := admintest.Do(t, http.MethodGet, hs.URL+"/v1/inbox/conflicts?handler=pay", "", nil)
	require.Equal(t, http.StatusOK, code, string(body))
	var got []admin.Conflict
	require.NoError(t, json.Unmarshal(body, &got))
	require.Len(t, got, 1)
	require.Equal(t, `{"order_id":"o1","n":2}`, got[0].Payload)
	code, body = admintest.Do(t, http.MethodGet, hs.URL+"/v1/inbox/conflicts?handler=nobody", "", nil)
	require.Equal(t, http.StatusOK, code)
	require.JSONEq(t, `[]`, string(body))
	code, body = admintest.Do(t, http.MethodGet, hs.URL+"/v1/inbox/dead?handler=ledger", "", nil)
	require.Equal(t, http.StatusOK, code)
	var dead []admin.DeadLetter
	require.NoError(t, json.Unmarshal(body, &dead))
	require.Len(t, dead, 1)
	require.Equal(t, "ledger", dead[0].Handler)
}
