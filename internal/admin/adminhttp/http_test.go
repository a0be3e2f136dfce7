package adminhttp_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/admin"
	"github.com/pgrelay/pgrelay/internal/admin/adminhttp"
	"github.com/pgrelay/pgrelay/internal/admin/admintest"
	"github.com/pgrelay/pgrelay/internal/inboxtest"
	"github.com/pgrelay/pgrelay/internal/logtest"
)

// TestServerRefusesToStartOffLoopbackWithoutToken: any address that is not
// loopback needs a admintest.Token; loopback does not.
func TestServerRefusesToStartOffLoopbackWithoutToken(t *testing.T) {
	t.Parallel()
	b := admintest.Setup(t)
	for _, addr := range []string{"0.0.0.0:9091", ":9091", "10.1.2.3:9091", "[::]:9091", "example.com:9091"} {
		_, err := adminhttp.NewServer(adminhttp.ServerConfig{Service: b.Svc, Addr: addr})
		require.ErrorContains(t, err, "--admin-token", addr)
	}
	for _, addr := range []string{"127.0.0.1:0", "localhost:9091", "[::1]:9091", "127.1.2.3:80"} {
		_, err := adminhttp.NewServer(adminhttp.ServerConfig{Service: b.Svc, Addr: addr})
		require.NoError(t, err, addr)
	}
	_, err := adminhttp.NewServer(adminhttp.ServerConfig{Service: b.Svc, Addr: "0.0.0.0:9091", Token: "short"})
	require.ErrorContains(t, err, "at least 16")
	_, err = adminhttp.NewServer(adminhttp.ServerConfig{Service: b.Svc, Addr: "nonsense"})
	require.ErrorContains(t, err, "--admin-addr")
	_, err = adminhttp.NewServer(adminhttp.ServerConfig{Service: b.Svc})
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:9091", adminhttp.ServerConfig{}.WithDefaults().Addr, "loopback by default")
}

// TestAPIRequiresTheToken: bound off loopback, every endpoint refuses a
// request without the right bearer admintest.Token and changes nothing.
func TestAPIRequiresTheToken(t *testing.T) {
	t.Parallel()
	b := admintest.Setup(t)
	admintest.Fixtures(t, b.Pool)
	srv, err := adminhttp.NewServer(adminhttp.ServerConfig{Service: b.Svc, Addr: "0.0.0.0:0", Token: admintest.Token})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	base := "http://" + ln.Addr().String()
	before := admintest.Snapshot(t, b.Pool)

	requeue := admin.RequeueRequest{All: true, Actor: "mallory", Reason: "r"}
	for _, bearer := range []string{"", "wrong-admintest.Token-0123456789", admintest.Token + "x", strings.ToUpper(admintest.Token)} {
		for _, c := range []struct {
			method, path string
			body         any
		}{
			{"GET", "/v1/stats", nil},
			{"GET", "/v1/inbox/dead", nil},
			{"GET", "/v1/inbox/dead/d-orders-1", nil},
			{"POST", "/v1/inbox/dead/requeue", requeue},
			{"POST", "/v1/inbox/dead/purge", map[string]any{"older_than": "0s", "actor": "mallory"}},
			{"GET", "/v1/audit", nil},
		} {
			code, body := admintest.Do(t, c.method, base+c.path, bearer, c.body)
			require.Equal(t, http.StatusUnauthorized, code, "%s %s with %q: %s", c.method, c.path, bearer, body)
		}
	}
	require.Equal(t, before, admintest.Snapshot(t, b.Pool), "refused requests change nothing")

	code, body := admintest.Do(t, "GET", base+"/v1/inbox/dead?topic=orders", admintest.Token, nil)
	require.Equal(t, http.StatusOK, code, string(body))
	var list []admin.DeadLetter
	require.NoError(t, json.Unmarshal(body, &list))
	require.Equal(t, []string{"d-orders-1", "d-orders-2"}, admintest.IDs(list))
}

// TestAPIOperations exercises every endpoint on a loopback server without a
// admintest.Token: list, show, dry-run and real requeue, purge, audit, stats, and the
// error mapping.
func TestAPIOperations(t *testing.T) {
	t.Parallel()
	b := admintest.Setup(t)
	admintest.Fixtures(t, b.Pool)
	srv, err := adminhttp.NewServer(adminhttp.ServerConfig{Service: b.Svc})
	require.NoError(t, err)
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()

	code, body := admintest.Do(t, "GET", hs.URL+"/v1/inbox/dead/d-users-1", "", nil)
	require.Equal(t, http.StatusOK, code, string(body))
	var d admin.DeadLetter
	require.NoError(t, json.Unmarshal(body, &d))
	require.Equal(t, "timeout", d.LastError)

	code, _ = admintest.Do(t, "GET", hs.URL+"/v1/inbox/dead/nope", "", nil)
	require.Equal(t, http.StatusNotFound, code)
	code, body = admintest.Do(t, "GET", hs.URL+"/v1/inbox/dead?since=yesterday", "", nil)
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, string(body), "since")
	code, _ = admintest.Do(t, "GET", hs.URL+"/v1/bogus/dead", "", nil)
	require.Equal(t, http.StatusBadRequest, code)
	code, body = admintest.Do(t, "POST", hs.URL+"/v1/inbox/dead/requeue", "", map[string]any{"actor": "a", "reason": "r", "bogus": 1})
	require.Equal(t, http.StatusBadRequest, code, "unknown fields are refused: %s", body)
	code, body = admintest.Do(t, "POST", hs.URL+"/v1/inbox/dead/requeue", "", admin.RequeueRequest{Actor: "a", Reason: "r"})
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, string(body), "without a filter")

	before := admintest.Snapshot(t, b.Pool)
	code, body = admintest.Do(t, "POST", hs.URL+"/v1/inbox/dead/requeue", "", admin.RequeueRequest{
		Filter: admin.Filter{EventType: "UserCreated"}, Actor: "ops", Reason: "fixed", DryRun: true})
	require.Equal(t, http.StatusOK, code, string(body))
	var res admin.Result
	require.NoError(t, json.Unmarshal(body, &res))
	require.True(t, res.DryRun)
	require.Equal(t, []string{"d-users-1"}, admintest.AffectedIDs(&res))
	require.Equal(t, before, admintest.Snapshot(t, b.Pool))

	code, body = admintest.Do(t, "POST", hs.URL+"/v1/inbox/dead/requeue", "", admin.RequeueRequest{
		Filter: admin.Filter{EventType: "UserCreated"}, Actor: "ops", Reason: "fixed"})
	require.Equal(t, http.StatusOK, code, string(body))
	st, _, _ := admintest.StatusOf(t, b.Pool, "d-users-1")
	require.Equal(t, "pending", st)

	code, body = admintest.Do(t, "POST", hs.URL+"/v1/inbox/dead/purge", "", map[string]any{"older_than": "24h", "actor": "ops", "dry_run": true})
	require.Equal(t, http.StatusOK, code, string(body))
	require.NoError(t, json.Unmarshal(body, &res))
	require.Equal(t, []string{"d-orders-1"}, admintest.AffectedIDs(&res))
	code, body = admintest.Do(t, "POST", hs.URL+"/v1/inbox/dead/purge", "", map[string]any{"older_than": "soon", "actor": "ops"})
	require.Equal(t, http.StatusBadRequest, code, string(body))

	code, body = admintest.Do(t, "GET", hs.URL+"/v1/audit?event_id=d-users-1", "", nil)
	require.Equal(t, http.StatusOK, code, string(body))
	var audit []admin.AuditEntry
	require.NoError(t, json.Unmarshal(body, &audit))
	require.Len(t, audit, 1)
	require.Equal(t, "ops", audit[0].Actor)

	code, body = admintest.Do(t, "GET", hs.URL+"/v1/stats", "", nil)
	require.Equal(t, http.StatusOK, code, string(body))
	var stats admin.Stats
	require.NoError(t, json.Unmarshal(body, &stats))
	require.Equal(t, int64(2), stats.Inbox.ByStatus["dead"])
}

// TestAPIConfirmBindsTheReviewedEvents: a purge confirmed with its dry run's
// confirmation is refused (409) when a third event went dead after the dry
// run showed 2, and runs on exactly those a new dry run showed.
func TestAPIConfirmBindsTheReviewedEvents(t *testing.T) {
	t.Parallel()
	b := admintest.Setup(t)
	admintest.Fixtures(t, b.Pool)
	srv, err := adminhttp.NewServer(adminhttp.ServerConfig{Service: b.Svc})
	require.NoError(t, err)
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	purge := func(dryRun bool, confirm string) (int, admin.Result, string) {
		t.Helper()
		code, body := admintest.Do(t, "POST", hs.URL+"/v1/inbox/dead/purge", "", map[string]any{
			"filter": map[string]any{"topic": "orders"}, "older_than": "0s", "actor": "ops", "dry_run": dryRun, "confirm": confirm})
		var res admin.Result
		if code == http.StatusOK {
			require.NoError(t, json.Unmarshal(body, &res))
		}
		return code, res, string(body)
	}
	code, dry, body := purge(true, "")
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, []string{"d-orders-1", "d-orders-2"}, admintest.AffectedIDs(&dry))
	require.NotEmpty(t, dry.Confirm)
	require.NotNil(t, dry.ConfirmExpires)

	_, err = b.Pool.Exec(context.Background(), `UPDATE pgrelay.inbox SET status = 'dead', finished_at = now() WHERE event_id = 'q-orders-1'`)
	require.NoError(t, err)
	before := admintest.Snapshot(t, b.Pool)
	code, _, body = purge(false, dry.Confirm)
	require.Equal(t, http.StatusConflict, code, body)
	require.Contains(t, body, "not the 2 reviewed")
	require.Equal(t, before, admintest.Snapshot(t, b.Pool))

	_, dry, _ = purge(true, "")
	code, res, body := purge(false, dry.Confirm)
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, []string{"d-orders-1", "d-orders-2", "q-orders-1"}, admintest.AffectedIDs(&res))
}

// TestRequeuedEventIsProcessedOnce: a dead event requeued through the API is
// claimed by the real inbox worker and its side effect happens exactly once,
// with the same event id.
func TestRequeuedEventIsProcessedOnce(t *testing.T) {
	t.Parallel()
	b := admintest.Setup(t)
	ctx := context.Background()
	_, err := b.Pool.Exec(ctx, `CREATE TABLE effects (event_id text NOT NULL)`)
	require.NoError(t, err)

	// The handler fails permanently until it is "fixed".
	var mu sync.Mutex
	fixed := false
	handler := pgrelay.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
		mu.Lock()
		ok := fixed
		mu.Unlock()
		if !ok {
			return pgrelay.Permanent(io.ErrUnexpectedEOF)
		}
		_, err := tx.Exec(ctx, `INSERT INTO effects (event_id) VALUES ($1)`, ev.EventID)
		return err
	})
	stats := &inboxtest.CountingObserver{}
	w, err := pgrelay.NewInboxWorker(pgrelay.InboxConfig{Pool: b.Pool, Handler: handler, Observer: stats, Logger: logtest.New(t),
		Workers: 1, PollInterval: 20 * time.Millisecond, Lease: 5 * time.Second, HandlerTimeout: 2 * time.Second})
	require.NoError(t, err)
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	t.Cleanup(func() { cancel(); <-done })

	in := pgrelay.Incoming{}
	in.EventID, in.Topic, in.EventType, in.Payload = "evt-42", "orders", "OrderPaid", []byte(`{}`)
	_, err = pgrelay.Receive(ctx, b.Pool, []pgrelay.Incoming{in})
	require.NoError(t, err)
	require.Eventually(t, func() bool { st, _, _ := admintest.StatusOf(t, b.Pool, "evt-42"); return st == "dead" },
		10*time.Second, 10*time.Millisecond)

	mu.Lock()
	fixed = true
	mu.Unlock()
	srv, err := adminhttp.NewServer(adminhttp.ServerConfig{Service: b.Svc})
	require.NoError(t, err)
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	code, body := admintest.Do(t, "POST", hs.URL+"/v1/inbox/dead/requeue", "", admin.RequeueRequest{
		Filter: admin.Filter{EventID: "evt-42"}, Actor: "ops", Reason: "handler fixed"})
	require.Equal(t, http.StatusOK, code, string(body))

	require.Eventually(t, func() bool { st, _, _ := admintest.StatusOf(t, b.Pool, "evt-42"); return st == "processed" },
		10*time.Second, 10*time.Millisecond)
	// A second requeue finds nothing dead, and a redelivery is absorbed.
	res, err := b.Svc.Requeue(ctx, admin.SourceInbox, admin.RequeueRequest{Filter: admin.Filter{EventID: "evt-42"}, Actor: "ops", Reason: "again"})
	require.NoError(t, err)
	require.Zero(t, res.Count)
	rr, err := pgrelay.Receive(ctx, b.Pool, []pgrelay.Incoming{in})
	require.NoError(t, err)
	require.Equal(t, []string{"evt-42"}, rr.Duplicates)

	var effects int
	require.NoError(t, b.Pool.QueryRow(ctx, `SELECT count(*) FROM effects WHERE event_id = 'evt-42'`).Scan(&effects))
	require.Equal(t, 1, effects, "the side effect happens exactly once")
	require.Equal(t, 1, stats.ProcessedCount("evt-42"))
	st, attempts, _ := admintest.StatusOf(t, b.Pool, "evt-42")
	require.Equal(t, "processed", st)
	require.Equal(t, 1, attempts, "attempts were reset by the requeue")
}

// TestConsoleMountKeepsTheAPIsAuth: with a console mounted, /console/ goes
// to it (which applies the token rules itself), / leads to it, and every
// other path still needs the bearer token.
func TestConsoleMountKeepsTheAPIsAuth(t *testing.T) {
	t.Parallel()
	b := admintest.Setup(t)
	con := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("console " + r.URL.Path)) })
	srv, err := adminhttp.NewServer(adminhttp.ServerConfig{Service: b.Svc, Addr: "0.0.0.0:0", Token: admintest.Token, Console: con})
	require.NoError(t, err)
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	code, body := admintest.Do(t, "GET", hs.URL+"/console/dead", "", nil)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "console /console/dead", string(body))
	for _, p := range []string{"/v1/stats", "/elsewhere", "/v1/inbox/dead"} {
		code, _ = admintest.Do(t, "GET", hs.URL+p, "", nil)
		require.Equal(t, http.StatusUnauthorized, code, p)
	}
	code, _ = admintest.Do(t, "GET", hs.URL+"/v1/stats", admintest.Token, nil)
	require.Equal(t, http.StatusOK, code)
	req, err := http.NewRequest(http.MethodGet, hs.URL+"/", nil)
	require.NoError(t, err)
	resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	require.Equal(t, "/console/", resp.Header.Get("Location"))
}

// TestAPIRefusesBrowserCrossSite: a POST from another origin (a "simple"
// cross-site request a page can send without a preflight) is refused, and
// without a token a Host that is not loopback (DNS rebinding) is refused;
// the same request from a non-browser client passes.
func TestAPIRefusesBrowserCrossSite(t *testing.T) {
	t.Parallel()
	b := admintest.Setup(t)
	admintest.Fixtures(t, b.Pool)
	srv, err := adminhttp.NewServer(adminhttp.ServerConfig{Service: b.Svc})
	require.NoError(t, err)
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	before := admintest.Snapshot(t, b.Pool)
	post := func(hdr map[string]string, host string) int {
		req, err := http.NewRequest(http.MethodPost, hs.URL+"/v1/inbox/dead/purge",
			strings.NewReader(`{"filter":{},"older_than":"0s","actor":"evil"}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "text/plain")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		if host != "" {
			req.Host = host
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusForbidden, post(map[string]string{"Origin": "http://evil.example"}, ""))
	require.Equal(t, http.StatusForbidden, post(map[string]string{"Sec-Fetch-Site": "cross-site"}, ""))
	require.Equal(t, http.StatusMisdirectedRequest, post(map[string]string{"Origin": "http://rebound.example:80"}, "rebound.example:80"))
	require.Equal(t, before, admintest.Snapshot(t, b.Pool), "nothing was purged")
	require.Equal(t, http.StatusOK, post(nil, ""), "a client that is not a browser")
}
