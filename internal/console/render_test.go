package console

import (
	"html"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/admin"
)

// TestRenderEscapes checks that values with markup and URL metacharacters
// come out escaped in text and attributes, and that links carry them intact
// (a link's query decodes to the value itself).
func TestRenderEscapes(t *testing.T) {
	const odd = `a<b>"c" 'd' &e+f g/h`
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	at := now.Add(-time.Minute)
	f := filterForm{Source: "inbox", Q: odd, Handler: odd, Limit: "5"}
	p := &page{Title: odd, Program: "consumer", CSRF: odd, Signed: true, Actor: odd, Now: now, Errors: []string{odd},
		write: show(deadPage, &deadListData{Filter: f, Counts: map[string]int64{"inbox": 1}, Handlers: []string{odd},
			List: []admin.DeadLetter{{Source: "inbox", Handler: odd, EventID: odd, Topic: odd, Key: odd, EventType: odd, DeadAt: &at, LastError: odd}}})}
	var w hw
	p.write(&w, p)
	out := w.String()
	if strings.Contains(out, "<b>") || strings.Contains(out, `"c"`) || strings.Contains(out, "'d'") {
		t.Fatalf("a value came out unescaped:\n%s", out)
	}
	const want = `a&lt;b&gt;&#34;c&#34; &#39;d&#39; &amp;e&#43;f g/h`
	if n := strings.Count(out, want); n < 8 {
		t.Fatalf("the escaped value appears %d times, want at least 8:\n%s", n, out)
	}

	href := func(page, text string) string {
		t.Helper()
		m := regexp.MustCompile(`href="([^"]*)"[^>]*>` + regexp.QuoteMeta(text) + `<`).FindStringSubmatch(page)
		if m == nil {
			t.Fatalf("no link %q in:\n%s", text, page)
		}
		u, err := url.Parse(strings.ReplaceAll(strings.ReplaceAll(m[1], "&amp;", "&"), "&#43;", "+"))
		if err != nil {
			t.Fatal(err)
		}
		return u.String()
	}
	u, _ := url.Parse(href(out, "link to this filter"))
	if got := u.Query(); got.Get("q") != odd || got.Get("handler") != odd || got.Get("source") != "inbox" || got.Get("limit") != "5" {
		t.Errorf("link to this filter: %q decodes to %v", u, got)
	}
	u, _ = url.Parse(href(out, want))
	if u.Path != "/console/dead/inbox/"+odd || u.Query().Get("handler") != odd {
		t.Errorf("event link %q: path %q, handler %q", u, u.Path, u.Query().Get("handler"))
	}

	p = &page{Title: "Ordered keys", Now: now, write: show(orderedPage, orderedData{Keys: []pgrelay.WaitingKey{{Handler: odd, Key: odd, State: "parked", Oldest: at}}})}
	w = hw{}
	p.write(&w, p)
	u, _ = url.Parse(href(w.String(), "dead event"))
	if q := u.Query(); q.Get("handler") != odd || q.Get("key") != odd {
		t.Errorf("parked key link %q decodes to %v", u, q)
	}
}

// everyPage renders each page function with data that reaches all of its
// links and forms, on p as given.
func everyPage(p page) map[string]string {
	now := p.Now
	at := now.Add(-time.Minute)
	dead := admin.DeadLetter{Source: "inbox", Handler: "h", EventID: "e 1", Status: "dead", Key: "k", DeadAt: &at, OtherHandlers: []string{"h2"}}
	audit := []admin.AuditEntry{{ID: 1, At: at, Source: "inbox", Action: "requeue", EventID: "e 1", Handler: "h"}}
	bulk := readAct(url.Values{"op": {"purge"}, "source": {"inbox"}, "topic": {"t"}, "actor": {"a"}})
	one := readAct(url.Values{"op": {"requeue"}, "source": {"inbox"}, "event_id": {"e 1"}, "handler": {"h"}, "actor": {"a"}})
	gap := readAct(url.Values{"op": {"skip-gap"}, "source": {"inbox"}, "handler": {"h"}, "gap_key": {"k"}, "actor": {"a"}})
	skip := readAct(url.Values{"op": {"skip-dead"}, "source": {"inbox"}, "handler": {"h"}, "event_id": {"e 1"}, "actor": {"a"}})
	res := &admin.Result{Count: 1, Events: []admin.Affected{{EventID: "e 1", Handler: "h"}}}
	stats := &admin.Stats{Inbox: admin.InboxStats{ByStatus: map[string]int64{"dead": 1},
		Handlers: []admin.HandlerStats{{Handler: "h", ByStatus: map[string]int64{"dead": 1}}}}}
	pages := map[string]func(*hw, *page){
		"error": show(errorPage, errorData{Status: 404, Message: "x"}),
		"login": show(loginPage, loginData{Next: "/console/"}),
		"audit": show(auditPage, auditData{List: audit}),
		"overview": show(overviewPage, &overviewData{Stats: stats, HasProcess: true,
			Handlers:  []handlerRow{{HandlerStats: stats.Inbox.Handlers[0], Processed: make([]int64, 60)}},
			Databases: []admin.DatabaseStatus{{Name: "main", Default: true}, {Name: "other", Error: "down"}}}),
		"dead":            show(deadPage, &deadListData{Filter: readFilter(url.Values{"topic": {"t"}}), List: []admin.DeadLetter{dead}}),
		"dead, no filter": show(deadPage, &deadListData{Filter: readFilter(nil), List: []admin.DeadLetter{dead}}),
		"event":           show(eventPage, &deadDetailData{Event: &dead, Audit: audit}),
		"ordered": show(orderedPage, orderedData{Handler: "h", Keys: []pgrelay.WaitingKey{{Handler: "h", Key: "g", State: "gap", Oldest: at},
			{Handler: "h", Key: "k", State: "parked", Oldest: at}}}),
		"conflicts":     show(conflictsPage, conflictsData{List: []conflictRow{{Conflict: admin.Conflict{Handler: "h", StoredEventID: "e 1"}}}}),
		"relay":         show(relayPage, relayData{Outbox: &admin.OutboxOverview{Partitions: []admin.Partition{{Dead: 1}}}}),
		"confirm bulk":  show(confirmPage, confirmData{Req: bulk, Verb: "purge", Result: res, Confirm: "c", Back: bulk.back()}),
		"confirm event": show(confirmPage, confirmData{Req: one, Verb: "requeue", Result: res, Confirm: "c", Back: one.back()}),
		"confirm gap":   show(confirmPage, confirmData{Req: gap, Verb: "skip", Key: &pgrelay.WaitingKey{Key: "k"}, Confirm: "c", Back: gap.back()}),
		"nothing to do": show(confirmPage, confirmData{Req: skip, Verb: "skip", Back: skip.back()}),
		"done":          show(donePage, doneData{Req: one, Verb: "requeue", Result: res, Back: one.back(), Audit: link{"audit", []string{"event_id", "e 1"}}}),
		"done skip":     show(donePage, doneData{Req: skip, Verb: "skip", Skip: &pgrelay.SkipResult{Key: "k"}, Back: skip.back(), Audit: link{path: "audit"}}),
	}
	out := map[string]string{}
	for name, write := range pages {
		p := p
		p.Nav, p.write = name, write
		var w hw
		p.write(&w, &p)
		out[name] = w.String()
	}
	return out
}

var (
	attrRe      = regexp.MustCompile(`(href|action)="([^"]*)"`)
	getFormRe   = regexp.MustCompile(`<form method="get"[^>]*>(<input type="hidden" name="database" value="([^"]*)">)?`)
	selectorRe  = regexp.MustCompile(`(?s)<nav class="databases".*?</nav>`)
	staticPath  = Prefix + "static/"
	consoleLink = func(v string) (*url.URL, error) { return url.Parse(html.UnescapeString(v)) }
)

// TestLinksCarryDatabase: on a page of a database named in the request,
// every console link, every POST form's action and every GET form (a hidden
// field) names it; the selector names each database; the stylesheet none.
// On a page naming none, no link names one.
func TestLinksCarryDatabase(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for name, out := range everyPage(page{Title: "t", Program: "relay", CSRF: "x", Signed: true, Now: now,
		Database: "other", Databases: []string{"main", "other"}}) {
		nav := selectorRe.FindString(out)
		if nav == "" {
			t.Fatalf("%s: no selector:\n%s", name, out)
		}
		for i, m := range attrRe.FindAllStringSubmatch(nav, -1) {
			u, err := consoleLink(m[2])
			if err != nil || u.Query().Get("database") != []string{"main", "other"}[i] {
				t.Errorf("%s: selector link %q", name, m[2])
			}
		}
		rest := strings.Replace(out, nav, "", 1)
		n := 0
		for _, m := range attrRe.FindAllStringSubmatch(rest, -1) {
			if m[2] == staticPath+"console.css" {
				continue
			}
			n++
			u, err := consoleLink(m[2])
			if err != nil || !strings.HasPrefix(u.Path, Prefix) {
				t.Errorf("%s: %s=%q is not a console URL", name, m[1], m[2])
				continue
			}
			if strings.Contains(rest, `<form method="get" action="`+m[2]+`"`) {
				if u.RawQuery != "" {
					t.Errorf("%s: a GET form's action %q has a query (the browser drops it)", name, m[2])
				}
				continue
			}
			if got := u.Query()["database"]; len(got) != 1 || got[0] != "other" {
				t.Errorf("%s: %s=%q names database %q, want other", name, m[1], m[2], got)
			}
		}
		if n == 0 {
			t.Errorf("%s: no links", name)
		}
		for _, m := range getFormRe.FindAllStringSubmatch(rest, -1) {
			if m[2] != "other" {
				t.Errorf("%s: a GET form without the database field: %q", name, m[0])
			}
		}
	}
	for name, out := range everyPage(page{Title: "t", Program: "relay", CSRF: "x", Signed: true, Now: now}) {
		if strings.Contains(out, "database=") || strings.Contains(out, `name="database"`) {
			t.Errorf("%s: a page naming no database names one:\n%s", name, out)
		}
	}
}
