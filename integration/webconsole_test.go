package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	pgnats "github.com/pgrelay/pgrelay/broker/nats"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/ledger"
	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/internal/testnats"
)

// chromiumPath finds Debian's Chromium; the test skips without it, except
// under CI, where .ci/run installs it.
func chromiumPath(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("Chromium is required for the web console test under CI (apt-get install chromium; .ci/run installs it)")
	}
	t.Skip("chromium not installed: the web console test needs it")
	return ""
}

// artifactDir is where the screenshots go: $PGRELAY_ARTIFACTS, else
// integration/testdata/artifacts (ignored by git).
func artifactDir(t *testing.T) string {
	dir := os.Getenv("PGRELAY_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join("testdata", "artifacts")
	}
	dir = filepath.Join(dir, "console")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	return dir
}

// nonLoopbackIP returns an IPv4 address of this machine that is not
// loopback, or "".
func nonLoopbackIP() string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return ""
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil && !n.IP.IsLinkLocalUnicast() {
			return n.IP.String()
		}
	}
	return ""
}

func freeAddrOn(t *testing.T, ip string) string {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

type browser struct {
	t   *testing.T
	ctx context.Context
	dir string
}

func (b *browser) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	require.NoError(b.t, chromedp.Do(ctx, steps...), what)
}

func (b *browser) text(sel string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
	require.NoError(b.t, err, sel)
	return s
}

// waitText waits until the element sel shows want (reloading the page
// between tries), and returns its text.
func (b *browser) waitText(sel, want string) string {
	b.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		s := b.text(sel)
		if strings.Contains(s, want) {
			return s
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("%s never showed %q; it shows:\n%s", sel, want, s)
		}
		time.Sleep(300 * time.Millisecond)
		b.do("reload", chromedp.Reload())
	}
}

// shot saves the page at desktop (1280 wide) and phone (390 wide) widths.
func (b *browser) shot(name string) {
	b.t.Helper()
	for _, v := range []struct {
		suffix string
		w, h   int64
		opts   []chromedp.EmulateViewportOption
	}{
		{"desktop", 1280, 860, nil},
		{"phone", 390, 844, []chromedp.EmulateViewportOption{chromedp.EmulateScale(2), chromedp.EmulateMobile}},
	} {
		ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
		require.NoError(b.t, chromedp.Do(ctx, chromedp.EmulateViewport(v.w, v.h, v.opts...)))
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		cancel()
		require.NoError(b.t, err)
		require.Greater(b.t, len(png), 1000)
		require.NoError(b.t, os.WriteFile(filepath.Join(b.dir, name+"-"+v.suffix+".png"), png, 0o644))
	}
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	require.NoError(b.t, chromedp.Do(ctx, chromedp.EmulateViewport(1280, 860)))
}

// insertDead stores a dead letter of handler ledger with a valid payload,
// as a handler failure since fixed would have left it.
func insertDead(t *testing.T, pool *pgxpool.Pool, eventID, orderID string) {
	t.Helper()
	b, err := json.Marshal(ledger.OrderCreated{OrderID: orderID, CustomerID: "c-42", AmountCents: 1250, Currency: "EUR"})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = pool.Exec(ctx, `INSERT INTO pgrelay.inbox (handler, event_id, dedup_key, topic, key, event_type, payload, headers,
		status, attempts, last_error, finished_at)
		VALUES ('ledger', $1, $1, 'orders', $2, $3, $4, '{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}',
		'dead', 5, 'ledger: connection refused (the ledger database was down)', now() - interval '20 minutes')`,
		eventID, orderID, ledger.EventOrderCreated, b)
	require.NoError(t, err)
}

// TestWebConsoleInChromium drives the web console in headless Chromium
// against a live relay and consumer: it opens every page, requeues a dead
// letter through the review and confirmation and sees the live consumer
// process it, checks the audit row against the CLI's, and checks that an
// admin address off loopback refuses actions without the token. It saves
// screenshots at desktop and phone widths.
func TestWebConsoleInChromium(t *testing.T) {
	t.Parallel()
	chromium := chromiumPath(t)
	dir := bins(t)
	dbURL := testdb.NewURL(t)
	pool := newPool(t, dbURL)
	natsURL := testnats.URL(t)
	stream, prefix := testnats.Stream(t, natsURL)

	// The relay's admin address is off loopback (with its token) when the
	// machine has such an address; the consumer's is on loopback, without.
	const token = "console-test-token-0123456789"
	relayIP := nonLoopbackIP()
	if relayIP == "" {
		t.Log("no non-loopback IPv4 address on this machine: the relay's console listens on 127.0.0.1 with a token")
		relayIP = "127.0.0.1"
	}
	relayAdmin := freeAddrOn(t, relayIP)
	startService(t, filepath.Join(dir, "relay"), []string{
		"DATABASE_URL=" + dbURL, "NATS_URL=" + natsURL, "RELAY_STREAM=" + stream, "RELAY_SUBJECT_PREFIX=" + prefix,
		"METRICS_ADDR=", "ADMIN_ADDR=" + relayAdmin, "ADMIN_TOKEN=" + token, "LOG_LEVEL=warn",
	}, "run")
	consumerAdmin := freeAddr(t)
	consumerBin := filepath.Join(dir, "consumer")
	startService(t, consumerBin, consumerEnv(dbURL, natsURL, stream, prefix, "ADMIN_ADDR="+consumerAdmin,
		"METRICS_ADDR="+freeAddr(t), "LOG_LEVEL=warn", "CONSUMER_HANDLER_NAME=ledger", "DEDUP_WINDOW=48h"), "run")

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ob, err := pgrelay.NewOutbox(pgrelay.OutboxConfig{})
	require.NoError(t, err)
	var msgs []pgrelay.Message
	for i := range 5 {
		id := fmt.Sprintf("order-%d", i)
		b, err := json.Marshal(ledger.OrderCreated{OrderID: id, CustomerID: "c", AmountCents: 100, Currency: "EUR"})
		require.NoError(t, err)
		msgs = append(msgs, pgrelay.Message{EventID: "created-" + id, Topic: "orders", Key: id, EventType: ledger.EventOrderCreated, Payload: b})
	}
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return ob.Enqueue(ctx, tx, msgs...) }))
	require.Eventually(t, func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox WHERE status = 'processed'`) == 5
	}, time.Minute, 50*time.Millisecond)
	// Two redeliveries under new broker message ids, absorbed by the inbox;
	// the second carries another order's payload: a key conflict.
	_, js := testnats.Connect(t, natsURL)
	for i, id := range []string{"created-order-0", "created-order-3"} {
		m := nats.NewMsg(prefix + ".orders")
		m.Header.Set(pgnats.MsgIDHeader, fmt.Sprintf("redelivery-%d", i))
		m.Header.Set(event.HeaderEventID, id)
		m.Header.Set(event.HeaderEventType, ledger.EventOrderCreated)
		m.Header.Set(event.HeaderTopic, "orders")
		m.Data = msgs[0].Payload
		_, err := js.PublishMsg(ctx, m)
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox_duplicates`) == 2
	}, time.Minute, 50*time.Millisecond)
	insertDead(t, pool, "created-order-web", "order-web")
	insertDead(t, pool, "created-order-cli", "order-cli")

	// One browser, one tab.
	allocCtx, allocCancel := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.WindowSize(1280, 860), chromedp.Flag("headless", "new"))...)
	defer allocCancel()
	bctx, bcancel := chromedp.NewContext(allocCtx)
	defer bcancel()
	// The first action starts the browser: without a timeout, which would
	// stop it.
	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate("about:blank")))
	b := &browser{t: t, ctx: bctx, dir: artifactDir(t)}
	base := "http://" + consumerAdmin + "/console/"

	// The overview, from the database and the consumer's own counters.
	b.do("overview", chromedp.Navigate(base))
	b.waitText("#handlers", "ledger")
	overview := b.waitText("main", "2 duplicates of 7 received in 24 h")
	require.Contains(t, overview, "created-order-3", "the recent duplicates")
	b.shot("overview")

	// A filtered dead-letter list is a stable link.
	b.do("dead list", chromedp.Navigate(base+"dead?source=inbox&handler=ledger&error=connection+refused"))
	list := b.waitText("#dead-list", "created-order-web")
	require.Contains(t, list, "created-order-cli")
	b.shot("dead-letters")

	// The detail page, then requeue: review (a dry run), confirm.
	b.do("detail", chromedp.Click(chromedp.Search(`//a[text()="created-order-web"]`)), chromedp.WaitVisible(chromedp.ID("payload")))
	payload := b.text("#payload")
	require.Contains(t, payload, `"order_id": "order-web"`, "pretty-printed")
	require.Contains(t, b.text("main"), "traceparent", "headers")
	require.Contains(t, b.text("#event"), "connection refused")
	b.do("fill in", chromedp.SetValue(chromedp.CSS(`#act input[name=actor]`), "web-operator"),
		chromedp.SendKeys(chromedp.ID("reason"), "ledger database back up"))
	b.shot("dead-letter")
	b.do("review", chromedp.Click(chromedp.ID("review")), chromedp.WaitVisible(chromedp.ID("dry-run")))
	require.Contains(t, b.text("#dry-run"), "Dry run: 1 event(s) would be requeued")
	require.Equal(t, "dead", statusOf(t, pool, "created-order-web"), "the dry run changed nothing")
	b.shot("confirm")
	b.do("confirm", chromedp.Click(chromedp.ID("confirm-run")), chromedp.WaitVisible(chromedp.ID("done")))
	require.Contains(t, b.text("#done"), "1 event(s) requeued")

	// The live consumer processes it.
	require.Eventually(t, func() bool { return statusOf(t, pool, "created-order-web") == "processed" },
		time.Minute, 100*time.Millisecond, "the requeued dead letter was processed")
	require.Equal(t, int64(1), queryInt(t, pool, `SELECT count(*) FROM ledger_orders WHERE order_id = 'order-web'`))
	b.do("back", chromedp.Click(chromedp.ID("back")), chromedp.WaitVisible(chromedp.ID("status")))
	b.waitText("#status", "processed")

	// The CLI requeues the other one; the two audit rows agree.
	cli := exec.CommandContext(ctx, consumerBin, "dead", "requeue", "created-order-cli", "--handler", "ledger",
		"--actor", "cli-operator", "--reason", "ledger database back up")
	cli.Env = append(os.Environ(), "DATABASE_URL="+dbURL)
	out, err := cli.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Eventually(t, func() bool { return statusOf(t, pool, "created-order-cli") == "processed" }, time.Minute, 100*time.Millisecond)
	type auditRow struct {
		Source, Action, Handler, Actor, Reason, PreviousError string
		PreviousAttempts                                      int32
	}
	audit := func(eventID string) auditRow {
		var r auditRow
		require.NoError(t, pool.QueryRow(ctx, `SELECT source, action, handler, actor, reason, coalesce(previous_error, ''), previous_attempts
			FROM pgrelay.replay_audit WHERE event_id = $1`, eventID).Scan(&r.Source, &r.Action, &r.Handler, &r.Actor, &r.Reason, &r.PreviousError, &r.PreviousAttempts))
		return r
	}
	web, byCLI := audit("created-order-web"), audit("created-order-cli")
	require.Equal(t, "web-operator", web.Actor)
	require.Equal(t, "cli-operator", byCLI.Actor)
	web.Actor, byCLI.Actor = "", ""
	require.Equal(t, byCLI, web, "the console writes the audit row the CLI writes")
	require.Equal(t, auditRow{Source: "inbox", Action: "requeue", Handler: "ledger", Reason: "ledger database back up",
		PreviousError: "ledger: connection refused (the ledger database was down)", PreviousAttempts: 5}, web)

	b.do("audit", chromedp.Navigate(base+"audit"))
	auditText := b.waitText("#audit", "cli-operator")
	require.Contains(t, auditText, "web-operator")
	b.shot("audit")
	b.do("ordered", chromedp.Navigate(base+"ordered"), chromedp.WaitVisible(chromedp.ID("keys")))
	b.do("conflicts", chromedp.Navigate(base+"conflicts"), chromedp.WaitVisible(chromedp.CSS(".conflict")))
	stored, conflicting := b.text(".conflict .side > div:first-child pre"), b.text(".conflict .side > div:last-child pre")
	require.Contains(t, stored, `"order_id": "order-3"`, "the stored payload")
	require.Contains(t, conflicting, `"order_id": "order-0"`, "the conflicting payload, side by side")
	b.shot("conflicts")
	b.do("relay page", chromedp.Navigate(base+"relay"))
	b.waitText("#partitions", "15")
	brokerText := b.text("#broker")
	require.Contains(t, brokerText, "2d00h", "the consumer's dedup window")
	require.Contains(t, brokerText, stream, "the stream the consumer reads")
	require.Contains(t, brokerText, "24h00m", "its MaxAge")
	require.Contains(t, b.text("main"), "within the dedup window 2d00h")
	b.shot("relay-from-consumer")
	b.do("overview again", chromedp.Navigate(base))
	b.waitText("main", "this process's counters over")
	b.shot("overview-after")

	// The relay's console off loopback: a page asks for the token, and an
	// action posted without it is refused and changes nothing.
	relayBase := "http://" + relayAdmin + "/console/"
	b.do("relay console", chromedp.Navigate(relayBase+"dead?source=outbox"), chromedp.WaitVisible(chromedp.ID("token")))
	b.shot("sign-in")
	auditRows := queryInt(t, pool, `SELECT count(*) FROM pgrelay.replay_audit`)
	insertDead(t, pool, "created-order-refused", "order-refused")
	forge := `(() => { const f = document.createElement('form'); f.method = 'post'; f.action = '/console/act';
		for (const [k, v] of Object.entries({op: 'requeue', source: 'inbox', event_id: 'created-order-refused', handler: 'ledger',
			actor: 'mallory', reason: 'no token', step: 'review', csrf: 'guess'})) {
			const i = document.createElement('input'); i.type = 'hidden'; i.name = k; i.value = v; f.appendChild(i); }
		document.body.appendChild(f); f.submit(); return true; })()`
	b.do("post without the token", chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := chromedp.Evaluate[bool](forge)(ctx, tg)
		return err
	}), chromedp.WaitVisible(chromedp.ID("error")))
	require.Contains(t, b.text("#error"), "the admin token is required")
	b.shot("refused")
	resp, err := http.PostForm(relayBase+"act", url.Values{"op": {"requeue"}, "source": {"inbox"}, "event_id": {"created-order-refused"},
		"handler": {"ledger"}, "actor": {"mallory"}, "reason": {"no token"}, "step": {"run"}})
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	require.Equal(t, "dead", statusOf(t, pool, "created-order-refused"))
	require.Equal(t, auditRows, queryInt(t, pool, `SELECT count(*) FROM pgrelay.replay_audit`), "nothing was audited")

	// Signed in with the token, the relay's pages open.
	b.do("sign in", chromedp.Navigate(relayBase+"relay"), chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), token), chromedp.Click(chromedp.ID("signin")), chromedp.WaitVisible(chromedp.ID("partitions")))
	parts := b.waitText("#partitions", "15")
	require.NotContains(t, parts, "free", "the relay holds every partition")
	require.Contains(t, b.text("#relays"), "alive")
	b.shot("relay")
	if relayIP == "127.0.0.1" {
		t.Log("the off-loopback refusal ran on loopback with a token: no other address was available")
	}
}

func statusOf(t *testing.T, pool *pgxpool.Pool, eventID string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var s string
	if err := pool.QueryRow(ctx, `SELECT status FROM pgrelay.inbox WHERE event_id = $1`, eventID).Scan(&s); err != nil {
		return "absent: " + err.Error()
	}
	return s
}
