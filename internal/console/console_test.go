package console_test

import (
	"context"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/admin"
	"github.com/pgrelay/pgrelay/internal/admin/admintest"
	"github.com/pgrelay/pgrelay/internal/console"
	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/migrations"
)

type client struct {
	t    *testing.T
	base string
	hc   *http.Client
	// header is added to every request.
	header http.Header
}

func newClient(t *testing.T, base string) *client {
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return &client{t: t, base: base, header: http.Header{}, hc: &http.Client{Jar: jar, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

func (c *client) do(method, path string, form url.Values) (int, string, http.Header) {
	c.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, c.base+path, body)
	require.NoError(c.t, err)
	for k, v := range c.header {
		req.Header[k] = v
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := c.hc.Do(req)
	require.NoError(c.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(c.t, err)
	return resp.StatusCode, string(b), resp.Header
}

func (c *client) get(path string) (int, string) {
	code, body, _ := c.do(http.MethodGet, path, nil)
	return code, body
}

var csrfRe = regexp.MustCompile(`name="csrf" value="([^"]+)"`)
var confirmRe = regexp.MustCompile(`name="confirm" value="([^"]+)"`)

var reviewedRe = regexp.MustCompile(`name="reviewed" value="([^"]+)"`)

// confirmed copies a review's confirmation (and what it reviewed) into form.
func confirmed(t *testing.T, form url.Values, body string) {
	t.Helper()
	form.Set("confirm", find(t, confirmRe, body))
	if m := reviewedRe.FindStringSubmatch(body); m != nil {
		form.Set("reviewed", html.UnescapeString(m[1]))
	}
}

func find(t *testing.T, re *regexp.Regexp, body string) string {
	t.Helper()
	m := re.FindStringSubmatch(body)
	require.NotNil(t, m, "%s not in page:\n%s", re, body)
	return m[1]
}

func start(t *testing.T, token string) (*admintest.Bundle, *httptest.Server) {
	return startWith(t, token, admintest.Setup(t), nil)
}

// startWith starts the console on b with the clock now (nil: time.Now).
func startWith(t *testing.T, token string, b *admintest.Bundle, now func() time.Time) (*admintest.Bundle, *httptest.Server) {
	admintest.Fixtures(t, b.Pool)
	reg := prometheus.NewRegistry()
	processed := prometheus.NewCounter(prometheus.CounterOpts{Name: "consumer_processed_total", ConstLabels: prometheus.Labels{"handler": "default"}})
	reg.MustRegister(processed)
	con, err := console.New(console.Config{Service: b.Svc, Program: "consumer", Token: token, Gatherer: reg,
		SampleEvery: 50 * time.Millisecond, DedupWindow: 12 * time.Hour, Now: now,
		Broker: func(context.Context) (*console.BrokerSettings, error) {
			return &console.BrokerSettings{Kind: "NATS JetStream stream", Name: "PGRELAY", MaxAge: 24 * time.Hour}, nil
		}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = con.Run(ctx) }()
	processed.Add(3)
	srv := httptest.NewServer(con.Handler())
	t.Cleanup(srv.Close)
	return b, srv
}

// TestPages: every page renders from the live database on loopback without
// a token, with stable filter links.
func TestPages(t *testing.T) {
	t.Parallel()
	_, srv := start(t, "")
	c := newClient(t, srv.URL)
	for path, want := range map[string][]string{
		"/console/":                              {"Inbox", "Outbox", "Dedup", "Per handler", "<svg class=\"chart", `http-equiv="refresh" content="30"`, `<td class="ok">current</td>`},
		"/console/dead":                          {"d-orders-1", "d-orders-2", "d-users-1", "Dry run", `name="all"`},
		"/console/dead?source=inbox&topic=users": {"d-users-1"},
		"/console/dead?q=d-orders-2":             {"d-orders-2", "link to this filter"},
		"/console/dead?error=timeout&since=60h":  {"d-orders-1"},
		"/console/dead/inbox/d-orders-1":         {"Timeout talking to ledger", "&#34;n&#34;: 1", "History"},
		"/console/ordered":                       {"no key waits"},
		"/console/conflicts":                     {"No key conflicts"},
		"/console/relay":                         {"Partitions", "12h00m", "PGRELAY", "shorter than the NATS JetStream stream"},
		"/console/audit":                         {"nothing recorded"},
		"/console/static/console.css":            {".chart"},
	} {
		code, body := c.get(path)
		require.Equal(t, http.StatusOK, code, "%s: %s", path, body)
		for _, w := range want {
			require.Contains(t, body, w, path)
		}
	}
	// The process's counters are sampled: the overview shows what they cover.
	require.Eventually(t, func() bool {
		_, body := c.get("/console/")
		return strings.Contains(body, "this process's counters over")
	}, 10*time.Second, 50*time.Millisecond)
	_, body := c.get("/console/")
	require.NotContains(t, body, "schema-behind")
	require.Contains(t, body, "retries per minute (this process)", "one database: the process's series")
	_, body = c.get("/console/dead?source=inbox&topic=users")
	require.NotContains(t, body, "d-orders-1", "the filter applies")
	require.NotContains(t, body, `name="all"`, "a filter has a condition")
	code, body := c.get("/console/dead?since=yesterday")
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, body, "since=")
	code, _ = c.get("/console/dead/inbox/nope")
	require.Equal(t, http.StatusNotFound, code)
	// One database: no selector, links as they were; naming another is 404.
	require.NotContains(t, body, `id="databases"`)
	require.NotContains(t, body, "database=")
	code, body = c.get("/console/?database=other")
	require.Equal(t, http.StatusNotFound, code)
	require.Contains(t, body, "this process serves one database")
}

// TestActionNeedsReviewAndCSRF: a requeue runs only with the CSRF token and
// the confirmation its dry run issued for exactly that request; the dry run
// changes nothing; the run writes the audit row the CLI writes.
func TestActionNeedsReviewAndCSRF(t *testing.T) {
	t.Parallel()
	b, srv := start(t, "")
	c := newClient(t, srv.URL)
	_, page := c.get("/console/dead/inbox/d-orders-2")
	csrf := find(t, csrfRe, page)
	form := url.Values{"op": {"requeue"}, "source": {"inbox"}, "event_id": {"d-orders-2"}, "handler": {"default"},
		"actor": {"alice"}, "reason": {"fixed the parser"}, "step": {"review"}}
	before := admintest.Snapshot(t, b.Pool)

	code, body, _ := c.do(http.MethodPost, "/console/act", form)
	require.Equal(t, http.StatusForbidden, code, "no CSRF token: %s", body)
	form.Set("csrf", "forged")
	code, _, _ = c.do(http.MethodPost, "/console/act", form)
	require.Equal(t, http.StatusForbidden, code, "a wrong CSRF token")
	form.Set("csrf", csrf)
	c.header.Set("Origin", "http://evil.example")
	code, _, _ = c.do(http.MethodPost, "/console/act", form)
	require.Equal(t, http.StatusForbidden, code, "another origin")
	c.header.Del("Origin")
	c.header.Set("Sec-Fetch-Site", "cross-site")
	code, _, _ = c.do(http.MethodPost, "/console/act", form)
	require.Equal(t, http.StatusForbidden, code, "cross-site")
	c.header.Del("Sec-Fetch-Site")

	run := url.Values{}
	for k, v := range form {
		run[k] = v
	}
	run.Set("step", "run")
	code, _, _ = c.do(http.MethodPost, "/console/act", run)
	require.Equal(t, http.StatusForbidden, code, "a run without a review")
	require.Equal(t, before, admintest.Snapshot(t, b.Pool))

	c.header.Set("Origin", srv.URL)
	code, body, _ = c.do(http.MethodPost, "/console/act", form)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "Dry run: 1 event(s) would be requeued")
	require.Equal(t, before, admintest.Snapshot(t, b.Pool), "the dry run changed nothing")
	confirmed(t, run, body)

	tampered := url.Values{}
	for k, v := range run {
		tampered[k] = v
	}
	tampered.Set("reason", "something else")
	code, _, _ = c.do(http.MethodPost, "/console/act", tampered)
	require.Equal(t, http.StatusForbidden, code, "the confirmation is bound to the reviewed request")
	tampered = url.Values{}
	for k, v := range run {
		tampered[k] = v
	}
	tampered.Del("event_id")
	tampered.Set("all", "1")
	code, _, _ = c.do(http.MethodPost, "/console/act", tampered)
	require.Equal(t, http.StatusForbidden, code, "nor to a wider filter")
	require.Equal(t, before, admintest.Snapshot(t, b.Pool))

	code, body, _ = c.do(http.MethodPost, "/console/act", run)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "1 event(s) requeued")
	st, attempts, _ := admintest.StatusOf(t, b.Pool, "d-orders-2")
	require.Equal(t, "pending", st)
	require.Zero(t, attempts)
	entries, err := b.Svc.Audit(context.Background(), "d-orders-2", "inbox", 10)
	require.NoError(t, err)
	require.Len(t, entries, 1)
	e := entries[0]
	require.Equal(t, []string{"requeue", "inbox", "default", "alice", "fixed the parser", "bad payload: unexpected EOF"},
		[]string{e.Action, e.Source, e.Handler, e.Actor, e.Reason, e.PreviousError})
	require.Equal(t, int32(5), e.PreviousAttempts)
	_, body = c.get("/console/audit?event_id=d-orders-2")
	require.Contains(t, body, "fixed the parser")
}

// TestBulkPurgeOnFilter: a purge of a filter shows its dry run first and
// then purges exactly what it showed.
func TestBulkPurgeOnFilter(t *testing.T) {
	t.Parallel()
	b, srv := start(t, "")
	c := newClient(t, srv.URL)
	_, page := c.get("/console/dead?source=inbox&topic=orders")
	form := url.Values{"csrf": {find(t, csrfRe, page)}, "op": {"purge"}, "source": {"inbox"}, "topic": {"orders"},
		"older_than": {"24h"}, "actor": {"bob"}, "reason": {"old junk"}, "step": {"review"}}
	code, body, _ := c.do(http.MethodPost, "/console/act", form)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "Dry run: 1 event(s) would be purged")
	require.Contains(t, body, "d-orders-1")
	require.NotContains(t, body, "d-orders-2", "dead for only 2h")
	form.Set("step", "run")
	confirmed(t, form, body)
	code, body, _ = c.do(http.MethodPost, "/console/act", form)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "1 event(s) purged")
	st, _, _ := admintest.StatusOf(t, b.Pool, "d-orders-1")
	require.Equal(t, "absent", st)
	st, _, _ = admintest.StatusOf(t, b.Pool, "d-orders-2")
	require.Equal(t, "dead", st)
}

// TestConfirmActsOnlyOnWhatWasReviewed: the review shows 2 dead events, a
// third goes dead before Confirm: the confirmation is refused and nothing is
// purged; a confirmation past its time is refused too.
func TestConfirmActsOnlyOnWhatWasReviewed(t *testing.T) {
	t.Parallel()
	b := admintest.Setup(t)
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	svc, err := admin.New(admin.Config{Pool: b.Pool, Now: func() time.Time { return time.Unix(0, now.Load()) }})
	require.NoError(t, err)
	b.Svc = svc
	_, srv := startWith(t, "", b, nil)
	c := newClient(t, srv.URL)
	_, page := c.get("/console/dead?source=inbox&topic=orders")
	review := func(form url.Values) url.Values {
		t.Helper()
		form.Set("step", "review")
		code, body, _ := c.do(http.MethodPost, "/console/act", form)
		require.Equal(t, http.StatusOK, code, body)
		form.Set("step", "run")
		confirmed(t, form, body)
		return form
	}
	form := review(url.Values{"csrf": {find(t, csrfRe, page)}, "op": {"purge"}, "source": {"inbox"}, "topic": {"orders"},
		"older_than": {"0s"}, "actor": {"bob"}, "reason": {"old junk"}})
	_, err = b.Pool.Exec(context.Background(),
		`UPDATE pgrelay.inbox SET status = 'dead', last_error = 'late', finished_at = now() WHERE event_id = 'q-orders-1'`)
	require.NoError(t, err)
	before := admintest.Snapshot(t, b.Pool)
	code, body, _ := c.do(http.MethodPost, "/console/act", form)
	require.Equal(t, http.StatusConflict, code, body)
	require.Contains(t, body, "the events it selects now (3) are not the 2 reviewed")
	require.Equal(t, before, admintest.Snapshot(t, b.Pool), "nothing was purged")

	form = review(form)
	now.Add(int64(admin.DefaultConfirmTTL + time.Second))
	code, body, _ = c.do(http.MethodPost, "/console/act", form)
	require.Equal(t, http.StatusConflict, code, body)
	require.Contains(t, body, "expired")
	require.Equal(t, before, admintest.Snapshot(t, b.Pool), "nothing was purged")
}

// TestTokenRules: with a token, pages ask to sign in, actions are refused
// without it, and a sign-in with it (or the bearer header) lets them
// through.
func TestTokenRules(t *testing.T) {
	t.Parallel()
	b, srv := start(t, admintest.Token)
	c := newClient(t, srv.URL)
	code, _, hdr := c.do(http.MethodGet, "/console/dead", nil)
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, "/console/login?next=%2Fconsole%2Fdead", hdr.Get("Location"))
	before := admintest.Snapshot(t, b.Pool)
	form := url.Values{"op": {"requeue"}, "source": {"inbox"}, "event_id": {"d-orders-2"}, "handler": {"default"},
		"actor": {"mallory"}, "reason": {"x"}, "step": {"review"}}
	code, body, _ := c.do(http.MethodPost, "/console/act", form)
	require.Equal(t, http.StatusUnauthorized, code, body)
	require.Contains(t, body, "the admin token is required")
	require.Equal(t, before, admintest.Snapshot(t, b.Pool))

	code, body, _ = c.do(http.MethodPost, "/console/login", url.Values{"token": {"wrong-token-0123456789"}})
	require.Equal(t, http.StatusUnauthorized, code)
	require.Contains(t, body, "wrong token")
	code, _, hdr = c.do(http.MethodPost, "/console/login", url.Values{"token": {admintest.Token}, "next": {"/console/dead"}})
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, "/console/dead", hdr.Get("Location"))
	code, page := c.get("/console/dead")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, page, "Sign out")
	form.Set("csrf", find(t, csrfRe, page))
	code, body, _ = c.do(http.MethodPost, "/console/act", form)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "Dry run: 1 event")

	bearer := newClient(t, srv.URL)
	bearer.header.Set("Authorization", "Bearer "+admintest.Token)
	code, _ = bearer.get("/console/relay")
	require.Equal(t, http.StatusOK, code)
	code, _, hdr = c.do(http.MethodPost, "/console/login", url.Values{"token": {admintest.Token}, "next": {"//evil.example/"}})
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, "/console/", hdr.Get("Location"), "no open redirect")
}

// TestHostCheckWithoutToken: without a token the console answers only to a
// loopback host name (a DNS-rebound page names its own).
func TestHostCheckWithoutToken(t *testing.T) {
	t.Parallel()
	_, srv := start(t, "")
	req, err := http.NewRequest(http.MethodGet, srv.URL+"/console/", nil)
	require.NoError(t, err)
	req.Host = "rebind.example:80"
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusMisdirectedRequest, resp.StatusCode)
	req.Host = "localhost"
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

// TestOrderedSkipsInTheConsole: the ordered page lists a gap and a parked
// key; skipping the gap and the dead event that parks the other key each
// go through a review and write their audit row.
func TestOrderedSkipsInTheConsole(t *testing.T) {
	t.Parallel()
	b, srv := start(t, "")
	ctx := context.Background()
	msg := func(id, key string, seq int64) pgrelay.Incoming {
		return pgrelay.Incoming{Message: pgrelay.Message{EventID: id, Topic: "orders", Key: key, KeySeq: seq, EventType: "T", Payload: []byte(`{}`)}}
	}
	_, err := pgrelay.Receive(ctx, b.Pool, []pgrelay.Incoming{msg("p-1", "p", 1), msg("p-2", "p", 2), msg("g-2", "g", 2)})
	require.NoError(t, err)
	_, err = b.Pool.Exec(ctx, `UPDATE pgrelay.inbox SET status = 'dead', last_error = 'poison', finished_at = now() WHERE event_id = 'p-1'`)
	require.NoError(t, err)

	c := newClient(t, srv.URL)
	code, page := c.get("/console/ordered")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, page, `class="k-gap">gap<`)
	require.Contains(t, page, `class="k-parked">parked<`)
	require.Contains(t, page, `href="/console/dead?source=inbox&amp;handler=default&amp;key=p"`, "a parked key links to its dead event")
	_, list := c.get("/console/dead?source=inbox&handler=default&key=p")
	require.Contains(t, list, "p-1")
	csrf := find(t, csrfRe, page)

	act := func(form url.Values, want string) {
		t.Helper()
		form.Set("csrf", csrf)
		form.Set("step", "review")
		code, body, _ := c.do(http.MethodPost, "/console/act", form)
		require.Equal(t, http.StatusOK, code, body)
		form.Set("step", "run")
		confirmed(t, form, body)
		code, body, _ = c.do(http.MethodPost, "/console/act", form)
		require.Equal(t, http.StatusOK, code, body)
		require.Contains(t, body, want)
	}
	act(url.Values{"op": {"skip-gap"}, "source": {"inbox"}, "handler": {"default"}, "gap_key": {"g"}, "actor": {"ops"}, "reason": {"lost upstream"}},
		"Skipped key g: sequences 1–1")
	act(url.Values{"op": {"skip-dead"}, "source": {"inbox"}, "handler": {"default"}, "event_id": {"p-1"}, "actor": {"ops"}, "reason": {"known bad"}},
		"Skipped key p: sequences 1–1")
	var n int
	require.NoError(t, b.Pool.QueryRow(ctx, `SELECT count(*) FROM pgrelay.replay_audit WHERE action IN ('skip_dead', 'skip_gap') AND actor = 'ops'`).Scan(&n))
	require.Equal(t, 2, n)
	_, page = c.get("/console/ordered")
	require.Contains(t, page, "no key waits")
}

// TestGapSkipBoundToTheReviewedGap: a gap skip reviewed for sequences 1…3 is
// refused once the gap changed, and once its confirmation expired.
func TestGapSkipBoundToTheReviewedGap(t *testing.T) {
	t.Parallel()
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	b, srv := startWith(t, "", admintest.Setup(t), func() time.Time { return time.Unix(0, now.Load()) })
	ctx := context.Background()
	msg := func(id string, seq int64) pgrelay.Incoming {
		return pgrelay.Incoming{Message: pgrelay.Message{EventID: id, Topic: "orders", Key: "h", KeySeq: seq, EventType: "T", Payload: []byte(`{}`)}}
	}
	_, err := pgrelay.Receive(ctx, b.Pool, []pgrelay.Incoming{msg("h-3", 3)})
	require.NoError(t, err)
	c := newClient(t, srv.URL)
	_, page := c.get("/console/ordered")
	form := url.Values{"csrf": {find(t, csrfRe, page)}, "op": {"skip-gap"}, "source": {"inbox"}, "handler": {"default"}, "gap_key": {"h"},
		"actor": {"ops"}, "reason": {"lost"}, "step": {"review"}}
	code, body, _ := c.do(http.MethodPost, "/console/act", form)
	require.Equal(t, http.StatusOK, code, body)
	form.Set("step", "run")
	confirmed(t, form, body)
	require.Equal(t, "1…3", form.Get("reviewed"))
	now.Add(int64(admin.DefaultConfirmTTL + time.Second))
	code, body, _ = c.do(http.MethodPost, "/console/act", form)
	require.Equal(t, http.StatusConflict, code, body)
	require.Contains(t, body, "expired")
	now.Add(-int64(2 * time.Minute))

	_, err = pgrelay.Receive(ctx, b.Pool, []pgrelay.Incoming{msg("h-2", 2)})
	require.NoError(t, err)
	before := admintest.Snapshot(t, b.Pool)
	code, body, _ = c.do(http.MethodPost, "/console/act", form)
	require.Equal(t, http.StatusConflict, code, body)
	require.Contains(t, body, "not the 1…3 reviewed")
	require.Equal(t, before, admintest.Snapshot(t, b.Pool))
}

// TestConfirmationBoundToDatabase: of two databases holding the same dead
// event, a requeue reviewed on one cannot be run on the other with its
// confirmation; run on its own, it changes that database only.
func TestConfirmationBoundToDatabase(t *testing.T) {
	t.Parallel()
	bs := map[string]*admintest.Bundle{"a": admintest.Setup(t), "b": admintest.Setup(t)}
	for _, b := range bs {
		admintest.Fixtures(t, b.Pool)
	}
	con, err := console.New(console.Config{Databases: admin.Databases{
		Names: func() []string { return []string{"a", "b"} },
		Service: func(name string) (*admin.Service, bool) {
			b, ok := bs[name]
			if !ok {
				return nil, false
			}
			return b.Svc, true
		}}})
	require.NoError(t, err)
	srv := httptest.NewServer(con.Handler())
	t.Cleanup(srv.Close)
	c := newClient(t, srv.URL)
	_, page := c.get("/console/dead/inbox/d-orders-2?database=a")
	require.Contains(t, page, `action="/console/act?database=a"`)
	form := url.Values{"op": {"requeue"}, "source": {"inbox"}, "event_id": {"d-orders-2"}, "handler": {"default"},
		"actor": {"alice"}, "reason": {"fixed"}, "step": {"review"}, "csrf": {find(t, csrfRe, page)}}
	code, body, _ := c.do(http.MethodPost, "/console/act?database=a", form)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "Dry run: 1 event(s) would be requeued")
	form.Set("step", "run")
	confirmed(t, form, body)

	code, body, _ = c.do(http.MethodPost, "/console/act?database=b", form)
	require.Equal(t, http.StatusForbidden, code, body)
	st, _, _ := admintest.StatusOf(t, bs["b"].Pool, "d-orders-2")
	require.Equal(t, "dead", st, "database b untouched")

	code, body, _ = c.do(http.MethodPost, "/console/act?database=a", form)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "1 event(s) requeued")
	st, _, _ = admintest.StatusOf(t, bs["a"].Pool, "d-orders-2")
	require.Equal(t, "pending", st)
	st, _, _ = admintest.StatusOf(t, bs["b"].Pool, "d-orders-2")
	require.Equal(t, "dead", st)
}

// TestOverviewOfEachDatabase: a process serving two databases, one a
// migration behind: the overview lists both with their schema versions and
// warns of the one behind; its process charts count the selected database's
// series only (the metrics' database label).
func TestOverviewOfEachDatabase(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a := admintest.Setup(t)
	u := testdb.EmptyURL(t)
	pool, err := pgxpool.New(ctx, u)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()
	p, err := migrations.NewProvider(sqlDB)
	require.NoError(t, err)
	sources := p.ListSources()
	latest, previous := sources[len(sources)-1].Version, sources[len(sources)-2].Version
	_, err = p.UpTo(ctx, previous)
	require.NoError(t, err)
	behind, err := admin.New(admin.Config{Pool: pool, QueryTimeout: 10 * time.Second})
	require.NoError(t, err)

	reg := prometheus.NewRegistry()
	dead := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "relay_dead_total"}, []string{"database"})
	errs := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "relay_publish_errors_total"}, []string{"database"})
	reg.MustRegister(dead, errs)
	svcs := map[string]*admin.Service{"a": a.Svc, "b": behind}
	con, err := console.New(console.Config{Program: "relay", Gatherer: reg, SampleEvery: 20 * time.Millisecond,
		Databases: admin.Databases{Names: func() []string { return []string{"a", "b"} },
			Service: func(n string) (*admin.Service, bool) { s, ok := svcs[n]; return s, ok }}})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	go func() { _ = con.Run(runCtx) }()
	srv := httptest.NewServer(con.Handler())
	t.Cleanup(srv.Close)
	c := newClient(t, srv.URL)

	// Counted once the samples cover some time, so that every increment
	// falls between two samples.
	require.Eventually(t, func() bool {
		_, body := c.get("/console/?database=b")
		return strings.Contains(body, "this process's counters of database b over")
	}, 10*time.Second, 50*time.Millisecond)
	dead.WithLabelValues("a").Add(2)
	errs.WithLabelValues("a").Add(1)
	dead.WithLabelValues("b").Add(5)
	errs.WithLabelValues("b").Add(4)
	for db, want := range map[string]string{"a": "<b>1</b> retries · <b>2</b> dead letters", "b": "<b>4</b> retries · <b>5</b> dead letters"} {
		var body string
		require.Eventually(t, func() bool {
			_, body = c.get("/console/?database=" + db)
			return strings.Contains(body, want)
		}, 10*time.Second, 50*time.Millisecond, "database %s: want %q", db, want)
		require.Contains(t, body, "dead letters per minute (this process, database "+db+")")
	}

	code, body := c.get("/console/")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, fmt.Sprintf(`Database <b>b</b> is behind: schema version %d of %d, 1 migration(s) pending`, previous, latest))
	require.Equal(t, 1, strings.Count(body, `id="schema-behind"`), "a is current")
	require.Regexp(t, fmt.Sprintf(`<tr><td>a \(default\)</td><td>%d</td><td>%d</td><td>0</td><td class="ok">current</td></tr>`, latest, latest), body)
	require.Regexp(t, fmt.Sprintf(`<tr><td>b</td><td>%d</td><td>%d</td><td>1</td><td class="warn">behind</td></tr>`, previous, latest), body)
}
