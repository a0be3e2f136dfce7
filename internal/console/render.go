package console

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/pgrelay/pgrelay/internal/admin"
)

// The pages are written by typed Go functions rather than html/template:
// executing a template reaches reflect.Value.MethodByName, which turns off
// the linker's dead-code elimination of methods for the whole program (about
// a sixth of each binary). Every value goes through esc (text and quoted
// attributes, the same characters html/template escapes); a console URL is
// built by page.url (url.PathEscape / url.QueryEscape first).

// hw accumulates a page.
type hw struct{ strings.Builder }

// raw writes markup as it is.
func (w *hw) raw(parts ...string) {
	for _, s := range parts {
		w.WriteString(s)
	}
}

// esc writes s escaped for HTML text or a quoted attribute value.
func (w *hw) esc(s string) {
	last := 0
	for i := 0; i < len(s); i++ {
		var r string
		switch s[i] {
		case 0:
			r = "\uFFFD"
		case '"':
			r = "&#34;"
		case '&':
			r = "&amp;"
		case '\'':
			r = "&#39;"
		case '+':
			r = "&#43;"
		case '<':
			r = "&lt;"
		case '>':
			r = "&gt;"
		default:
			continue
		}
		w.WriteString(s[last:i])
		w.WriteString(r)
		last = i + 1
	}
	w.WriteString(s[last:])
}

// num writes an integer.
func (w *hw) num(n int64) { w.WriteString(strconv.FormatInt(n, 10)) }

// on writes ` class="on"` when cond holds.
func (w *hw) on(cond bool) {
	if cond {
		w.raw(` class="on"`)
	}
}

// hidden writes a hidden input.
func (w *hw) hidden(name, value string) {
	w.raw(`<input type="hidden" name="`)
	w.esc(name)
	w.raw(`" value="`)
	w.esc(value)
	w.raw(`">`)
}

// url is the console URL of path (below Prefix, its segments escaped) with
// the query pairs given (name, value; an empty value is left out) and the
// page's database when the request named one. Every console link and POST
// action of a page is built by it; GET forms carry the database by getForm.
func (p *page) url(path string, query ...string) string {
	return consoleURL(p.Database, path, query...)
}

// consoleURL is url for the named database ("": none).
func consoleURL(database, path string, query ...string) string {
	var b strings.Builder
	b.WriteString(Prefix + path)
	sep := "?"
	add := func(k, v string) {
		if v != "" {
			b.WriteString(sep + url.QueryEscape(k) + "=" + url.QueryEscape(v))
			sep = "&"
		}
	}
	for i := 0; i+1 < len(query); i += 2 {
		add(query[i], query[i+1])
	}
	add("database", database)
	return b.String()
}

// href writes p.url(path, query...) escaped for an attribute.
func (w *hw) href(p *page, path string, query ...string) { w.esc(p.url(path, query...)) }

// getForm opens a GET form to path. A browser replaces the query of a GET
// form's action with the form's fields, so the page's database goes in a
// hidden field.
func getForm(w *hw, p *page, path, attrs string) {
	w.raw(`<form method="get" action="`, Prefix, path, `"`, attrs, ">")
	if p.Database != "" {
		w.hidden("database", p.Database)
	}
}

// postForm opens a POST form to path, the database in its action's query
// (where the request's database is read).
func postForm(w *hw, p *page, path, attrs string) {
	w.raw(`<form method="post" action="`)
	w.href(p, path)
	w.raw(`"`, attrs, ">")
}

func (w *hw) stamp(t any)                             { w.esc(stamp(t)) }
func (w *hw) ago(now time.Time, t any)                { w.esc(ago(now, t)) }
func (w *hw) secs(s float64)                          { w.esc(fmtDur(time.Duration(s * float64(time.Second)))) }
func (w *hw) chart(t string, v []int64, class string) { w.raw(barChart(t, v, class)) }

func pct(f float64) string { return strconv.FormatFloat(f*100, 'f', 1, 64) + "%" }

// show binds a page function to its data: the page's body, written between
// head and foot by the page function itself.
func show[T any](f func(*hw, *page, T), d T) func(*hw, *page) {
	return func(w *hw, p *page) { f(w, p, d) }
}

func errorPage(w *hw, p *page, d errorData) {
	head(w, p)
	w.raw("\n", `<p class="err" id="error">`)
	w.esc(d.Message)
	w.raw("</p>\n", `<p><a href="`)
	w.href(p, "")
	w.raw(`">Back to the overview</a></p>`, "\n")
	foot(w, p)
}

func head(w *hw, p *page) {
	w.raw("<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n",
		`<meta name="viewport" content="width=device-width, initial-scale=1">`, "\n")
	if p.Refresh != 0 {
		w.raw(`<meta http-equiv="refresh" content="`)
		w.num(int64(p.Refresh))
		w.raw(`">`)
	}
	w.raw("\n<title>")
	w.esc(p.Title)
	w.raw(" · pgrelay ")
	w.esc(p.Program)
	w.raw("</title>\n", `<link rel="stylesheet" href="`, Prefix, `static/console.css">`, "\n</head>\n<body>\n",
		`<header class="top">`, "\n", `  <a class="brand" href="`)
	w.href(p, "")
	w.raw(`">pgrelay <span>`)
	w.esc(p.Program)
	w.raw("</span></a>\n  <nav>")
	for _, n := range []struct{ path, label string }{{"", "Overview"}, {"dead", "Dead letters"}, {"ordered", "Ordered keys"},
		{"relay", "Relay"}, {"audit", "Audit"}} {
		w.raw("\n", `    <a href="`)
		w.href(p, n.path)
		w.raw(`"`)
		s, ok := section(p.Nav)
		w.on(ok && s == n.path)
		w.raw(">", n.label, "</a>")
	}
	w.raw("\n  </nav>\n  ")
	if len(p.Databases) > 1 {
		databaseNav(w, p)
	}
	if p.Signed {
		postForm(w, p, "logout", ` class="signout"`)
		w.hidden("csrf", p.CSRF)
		w.raw(`<button>Sign out</button></form>`)
	}
	w.raw("\n</header>\n<main>\n<h1>")
	w.esc(p.Title)
	w.raw("</h1>\n")
	for _, e := range p.Errors {
		w.raw(`<p class="warn">`)
		w.esc(e)
		w.raw("</p>")
	}
	w.raw("\n")
}

// section is the path of the navigation entry a page is under; false for
// a page under none (an error, a confirmation).
func section(nav string) (string, bool) {
	switch nav {
	case "overview":
		return "", true
	case "dead", "event":
		return "dead", true
	case "ordered", "conflicts":
		return "ordered", true
	case "relay", "audit":
		return nav, true
	}
	return "", false
}

// databaseNav is the database selector: each database's link to this
// page's section (conflicts its own), each naming its database.
func databaseNav(w *hw, p *page) {
	to, _ := section(p.Nav)
	if p.Nav == "conflicts" {
		to = "conflicts"
	}
	w.raw(`<nav class="databases" id="databases">Database`)
	for i, n := range p.Databases {
		w.raw(` <a href="`)
		w.esc(consoleURL(n, to))
		w.raw(`"`)
		w.on(n == p.Database || p.Database == "" && i == 0)
		w.raw(">")
		w.esc(n)
		w.raw("</a>")
	}
	w.raw("</nav>\n  ")
}

func foot(w *hw, p *page) {
	w.raw("\n</main>\n<footer>Rendered ")
	w.stamp(p.Now)
	w.raw(" · every action goes through the admin operations of the CLI and is written to the audit table</footer>\n</body>\n</html>\n")
}

func actorInput(w *hw, actor string) {
	w.raw(`<label>Actor <input name="actor" required maxlength="200" placeholder="your name" value="`)
	w.esc(actor)
	w.raw(`"></label>`)
}

// eventPath is the path of an event's page.
func eventPath(source, eventID string) string {
	return "dead/" + url.PathEscape(source) + "/" + url.PathEscape(eventID)
}

func loginPage(w *hw, p *page, d loginData) {
	head(w, p)
	w.raw("\n<p>This console is on a non-loopback address (or has a token set): sign in with the admin token (<code>--admin-token</code> / <code>ADMIN_TOKEN</code>).</p>\n")
	if d.Error != "" {
		w.raw(`<p class="err">`)
		w.esc(d.Error)
		w.raw(`</p>`)
	}
	w.raw("\n")
	postForm(w, p, "login", ` class="card narrow"`)
	w.raw("\n  ")
	w.hidden("next", d.Next)
	w.raw("\n", `  <label>Admin token <input type="password" name="token" id="token" autocomplete="current-password" required></label>`,
		"\n", `  <button id="signin">Sign in</button>`, "\n</form>\n")
	foot(w, p)
}

func auditTable(w *hw, p *page, list []admin.AuditEntry) {
	w.raw(`<div class="scroll"><table class="audit stack">`, "\n",
		`<thead><tr><th>#</th><th>when</th><th>who</th><th>did</th><th>source</th><th>event</th><th>handler</th><th>why</th><th>before</th></tr></thead>`,
		"\n<tbody>")
	for _, a := range list {
		w.raw("<tr><td>")
		w.num(a.ID)
		w.raw("</td><td>")
		w.stamp(a.At)
		w.raw("</td><td>")
		w.esc(a.Actor)
		w.raw(`</td><td class="act-`)
		w.esc(a.Action)
		w.raw(`">`)
		w.esc(a.Action)
		w.raw("</td><td>")
		w.esc(a.Source)
		w.raw("</td>\n<td>")
		if a.EventID == "*" {
			w.raw("*")
		} else {
			w.raw(`<a href="`)
			w.href(p, eventPath(a.Source, a.EventID), "handler", a.Handler)
			w.raw(`">`)
			w.esc(a.EventID)
			w.raw("</a>")
		}
		w.raw("</td>\n<td>")
		w.esc(a.Handler)
		w.raw(`</td><td class="reason">`)
		w.esc(a.Reason)
		w.raw(`</td><td class="reason">`)
		w.num(int64(a.PreviousAttempts))
		w.raw(" att.")
		if a.PreviousError != "" {
			w.raw(": ")
			w.esc(a.PreviousError)
		}
		w.raw("</td></tr>\n")
	}
	if len(list) == 0 {
		w.raw(`<tr><td colspan="9">nothing recorded</td></tr>`)
	}
	w.raw("</tbody></table></div>")
}

func auditPage(w *hw, p *page, d auditData) {
	head(w, p)
	getForm(w, p, "audit", ` class="filters"`)
	w.raw("\n", `  <label>Event <input name="event_id" value="`)
	w.esc(d.EventID)
	w.raw(`"></label>`, "\n", `  <label>Source <select name="source"><option value="">any</option><option`)
	if d.Source == "inbox" {
		w.raw(" selected")
	}
	w.raw(">inbox</option><option")
	if d.Source == "outbox" {
		w.raw(" selected")
	}
	w.raw(">outbox</option></select></label>\n  <button>Filter</button>\n</form>\n", `<div id="audit">`)
	auditTable(w, p, d.List)
	w.raw("</div>\n")
	foot(w, p)
}

func overviewPage(w *hw, p *page, d *overviewData) {
	head(w, p)
	for _, db := range d.Databases {
		if st := db.Schema; st != nil && st.Behind() {
			w.raw(`<p class="advice" id="schema-behind">`)
			if db.Name == "" {
				w.raw("The database")
			} else {
				w.raw("Database <b>")
				w.esc(db.Name)
				w.raw("</b>")
			}
			w.raw(" is behind: schema version ")
			w.num(st.Current)
			w.raw(" of ")
			w.num(st.Latest)
			w.raw(", ")
			w.num(int64(len(st.Pending)))
			w.raw(" migration(s) pending. Apply them (<code>migrate up</code>) once every process using it runs this version.</p>\n")
		}
	}
	if st := d.Stats; st != nil {
		w.raw("\n", `<section class="cards">`, "\n", `  <div class="card"><h2>Inbox</h2>`, "\n    ")
		statusList(w, admin.InboxStatuses, st.Inbox.ByStatus)
		w.raw("\n", `    <p class="sub">consumer lag <b>`)
		w.secs(st.Inbox.OldestClaimableSeconds)
		w.raw("</b> · oldest pending <b>")
		w.secs(st.Inbox.OldestPendingSeconds)
		w.raw("</b> · ")
		w.esc(admin.HumanBytes(st.Inbox.TableBytes))
		w.raw("</p>\n  </div>\n", `  <div class="card"><h2>Outbox</h2>`, "\n    ")
		statusList(w, admin.OutboxStatuses, st.Outbox.ByStatus)
		w.raw("\n", `    <p class="sub">relay lag (oldest pending) <b>`)
		w.secs(st.Outbox.OldestPendingSeconds)
		w.raw("</b> · ")
		w.esc(admin.HumanBytes(st.Outbox.TableBytes))
		w.raw("</p>\n  </div>\n", `  <div class="card"><h2>Dedup</h2>`, "\n    ")
		if dd := d.Dedup; dd != nil {
			w.raw(`<p class="big">`)
			w.esc(pct(dd.HitRate))
			w.raw(`</p><p class="sub">`)
			w.num(dd.Duplicates)
			w.raw(" duplicates of ")
			w.num(dd.Received)
			w.raw(" received in 24 h</p>\n    ")
			w.chart("duplicates per hour, last 24 h", d.DedupHours, "dup")
		}
		w.raw("\n    ")
		if pd := st.Dedup; pd != nil {
			w.raw(`<p class="sub">this process: `)
			w.esc(fmt.Sprint(pd.Duplicates))
			w.raw(" of ")
			w.esc(fmt.Sprint(pd.Received))
			w.raw(" (")
			w.esc(pct(pd.HitRate))
			w.raw(")</p>")
		}
		o := st.Ordered
		w.raw("\n  </div>\n", `  <div class="card"><h2>Ordered keys</h2>`, "\n", `    <dl class="st"><dt>gaps</dt><dd>`)
		w.num(o.Gaps)
		w.raw("</dd><dt>parked</dt><dd")
		if o.Parked > 0 {
			w.raw(` class="s-dead"`)
		}
		w.raw(">")
		w.num(o.Parked)
		w.raw("</dd><dt>behind</dt><dd>")
		w.num(o.Behind)
		w.raw("</dd><dt>held</dt><dd>")
		w.num(o.Held)
		w.raw("</dd></dl>\n", `    <p class="sub"><a href="`)
		w.href(p, "ordered")
		w.raw(`">waiting keys</a> · <a href="`)
		w.href(p, "conflicts")
		w.raw(`">key conflicts</a></p>`, "\n  </div>\n</section>\n")
	}
	w.raw("\n", `<section class="cards">`, "\n", `  <div class="card wide"><h2>Published by the relays, last hour</h2>`, "\n    ")
	if d.Outbox != nil {
		w.chart("outbox rows published per minute", throughputCounts(d.Outbox.Minutes), "pub")
		w.raw(`<p class="sub">`)
		w.num(d.Outbox.Total)
		w.raw(" published (from the database)</p>")
	} else {
		w.raw(`<p class="sub">none in the last hour</p>`)
	}
	w.raw("\n  </div>\n", `  <div class="card wide"><h2>Retries and dead letters, last hour</h2>`, "\n    ")
	if d.HasProcess {
		of := "this process"
		if d.ProcessDatabase != "" {
			of += ", database " + d.ProcessDatabase
		}
		w.chart("retries per minute ("+of+")", d.Retries, "retry")
		w.chart("dead letters per minute ("+of+")", d.Dead, "dead")
		w.raw("\n", `    <p class="sub"><b>`)
		w.num(d.RetriesTotal)
		w.raw("</b> retries · <b>")
		w.num(d.DeadTotal)
		w.raw("</b> dead letters · this process's counters")
		if d.ProcessDatabase != "" {
			w.raw(" of database ")
			w.esc(d.ProcessDatabase)
		}
		if d.Covered != 0 {
			w.raw(" over ")
			w.esc(fmtDur(d.Covered))
		} else {
			w.raw(": collecting (a sample every few seconds)")
		}
		w.raw(" · retries are handler retries or transient publish errors</p>")
	} else {
		w.raw(`<p class="sub">process counters not available</p>`)
	}
	w.raw("\n  </div>\n</section>\n<h2>Per handler</h2>\n", `<div class="scroll"><table id="handlers">`, "\n",
		`<thead><tr><th>handler</th><th>pending</th><th>processing</th><th>processed</th><th>dead</th><th>processed, last hour</th><th>retries (process)</th></tr></thead>`,
		"\n<tbody>")
	for _, h := range d.Handlers {
		w.raw("<tr>\n", `<td><a href="`)
		w.href(p, "dead", "source", "inbox", "handler", h.Handler)
		w.raw(`">`)
		w.esc(h.Handler)
		w.raw("</a></td>\n<td>")
		w.num(h.ByStatus["pending"])
		w.raw("</td><td>")
		w.num(h.ByStatus["processing"])
		w.raw("</td><td>")
		w.num(h.ByStatus["processed"])
		w.raw("</td>\n<td>")
		if n := h.ByStatus["dead"]; n > 0 {
			w.raw(`<a href="`)
			w.href(p, "dead", "source", "inbox", "handler", h.Handler)
			w.raw(`">`)
			w.num(n)
			w.raw("</a>")
		} else {
			w.raw("0")
		}
		w.raw("</td>\n", `<td class="spark">`)
		w.chart(h.Handler+": processed per minute", h.Processed, "pub")
		w.raw(" ")
		w.num(h.Total)
		w.raw("</td>\n", `<td class="spark">`)
		switch {
		case h.Retries != nil:
			w.chart(h.Retries.Handler+": retries per minute", h.Retries.Minutes, "retry")
			w.raw(" ")
			w.esc(strconv.FormatFloat(h.Retries.Total, 'f', 0, 64))
		case d.HasProcess:
			w.raw("0")
		default:
			w.raw("—")
		}
		w.raw("</td>\n</tr>")
	}
	if len(d.Handlers) == 0 {
		w.raw(`<tr><td colspan="7">no inbox rows</td></tr>`)
	}
	w.raw("</tbody>\n</table></div>\n")
	if dd := d.Dedup; dd != nil && len(dd.Recent) > 0 {
		w.raw("<h2>Recent duplicates blocked</h2>\n",
			`<div class="scroll"><table><thead><tr><th>seen</th><th>event</th><th>handler</th><th>topic</th><th>original age</th></tr></thead><tbody>`, "\n")
		for _, r := range dd.Recent {
			w.raw("<tr><td>")
			w.ago(p.Now, r.SeenAt)
			w.raw("</td><td><code>")
			w.esc(r.EventID)
			w.raw("</code></td><td>")
			w.esc(r.Handler)
			w.raw("</td><td>")
			w.esc(r.Topic)
			w.raw("</td><td>")
			if r.OriginalReceivedAt != nil {
				w.secs(r.OriginalAgeSeconds)
			} else {
				w.raw("same batch")
			}
			w.raw("</td></tr>")
		}
		w.raw("\n</tbody></table></div>")
	}
	schemaTable(w, d.Databases)
	foot(w, p)
}

// schemaTable lists the databases served with their schema versions.
func schemaTable(w *hw, dbs []admin.DatabaseStatus) {
	w.raw("\n<h2>Schema</h2>\n", `<div class="scroll"><table id="schema"><thead><tr><th>database</th><th>version</th><th>latest</th><th>pending</th><th></th></tr></thead><tbody>`, "\n")
	for _, db := range dbs {
		w.raw("<tr><td>")
		w.esc(db.Name)
		if db.Default && len(dbs) > 1 {
			w.raw(" (default)")
		}
		w.raw("</td>")
		switch st := db.Schema; {
		case st == nil:
			w.raw(`<td colspan="4" class="s-dead">`)
			w.esc(db.Error)
			w.raw("</td>")
		default:
			w.raw("<td>")
			w.num(st.Current)
			w.raw("</td><td>")
			w.num(st.Latest)
			w.raw("</td><td>")
			w.num(int64(len(st.Pending)))
			if st.Behind() {
				w.raw(`</td><td class="warn">behind`)
			} else {
				w.raw(`</td><td class="ok">current`)
			}
			w.raw("</td>")
		}
		w.raw("</tr>\n")
	}
	w.raw("</tbody></table></div>\n")
}

// statusList writes the status counts of the overview's cards.
func statusList(w *hw, statuses []string, by map[string]int64) {
	w.raw(`<dl class="st">`)
	for _, s := range statuses {
		w.raw("<dt>")
		w.esc(s)
		w.raw("</dt><dd")
		n := by[s]
		if n > 0 {
			w.raw(` class="s-`)
			w.esc(s)
			w.raw(`"`)
		}
		w.raw(">")
		w.num(n)
		w.raw("</dd>")
	}
	w.raw("</dl>")
}

func deadPage(w *hw, p *page, d *deadListData) {
	f := d.Filter
	inboxSrc := f.Source == "inbox"
	head(w, p)
	w.raw("\n", `<p class="tabs">`, "\n", `  <a href="`)
	w.href(p, "dead", "source", "inbox")
	w.raw(`"`)
	w.on(inboxSrc)
	w.raw(">Inbox")
	if len(d.Counts) > 0 {
		w.raw(" (")
		w.num(d.Counts["inbox"])
		w.raw(")")
	}
	w.raw("</a>\n", `  <a href="`)
	w.href(p, "dead", "source", "outbox")
	w.raw(`"`)
	w.on(f.Source == "outbox")
	w.raw(">Outbox")
	if len(d.Counts) > 0 {
		w.raw(" (")
		w.num(d.Counts["outbox"])
		w.raw(")")
	}
	w.raw("</a>\n</p>\n")
	getForm(w, p, "dead", ` class="filters" id="filters"`)
	w.raw("\n  ")
	w.hidden("source", f.Source)
	input := func(label, name, value, extra string) {
		w.raw("\n  <label>", label, ` <input name="`, name, `" value="`)
		w.esc(value)
		w.raw(`"`, extra, "></label>")
	}
	input("Search", "q", f.Q, ` placeholder="event id or key"`)
	w.raw("\n  ")
	if inboxSrc {
		w.raw(`<label>Handler <input name="handler" value="`)
		w.esc(f.Handler)
		w.raw(`" list="handlers"></label>`, "\n", `  <datalist id="handlers">`)
		for _, h := range d.Handlers {
			w.raw(`<option value="`)
			w.esc(h)
			w.raw(`">`)
		}
		w.raw("</datalist>")
	}
	input("Topic", "topic", f.Topic, "")
	input("Type", "type", f.Type, "")
	input("Key", "key", f.Key, "")
	input("Reason contains", "error", f.Error, "")
	input("Dead since", "since", f.Since, ` placeholder="24h or 2026-01-02T15:04"`)
	input("until", "until", f.Until, ` placeholder="1h or RFC 3339"`)
	input("Limit", "limit", f.Limit, ` size="5" inputmode="numeric"`)
	w.raw("\n", `  <button>Filter</button> <a href="`)
	w.href(p, "dead", "source", f.Source)
	w.raw(`">clear</a>`, "\n</form>\n", `<p class="sub">`)
	w.num(int64(len(d.List)))
	w.raw(" dead ")
	w.esc(f.Source)
	w.raw(" event(s)")
	if q := f.query(); len(q) > 0 {
		w.raw(` · <a href="`)
		w.href(p, "dead", q...)
		w.raw(`">link to this filter</a>`)
	}
	w.raw("</p>\n", `<div class="scroll"><table id="dead-list" class="stack">`, "\n<thead><tr><th>event</th>")
	if inboxSrc {
		w.raw("<th>handler</th>")
	}
	w.raw("<th>topic</th><th>type</th><th>key</th><th>att.</th><th>dead</th><th>reason</th></tr></thead>\n<tbody>")
	for _, e := range d.List {
		w.raw("<tr>\n", `<td><a class="ev" href="`)
		w.href(p, eventPath(string(e.Source), e.EventID), "handler", e.Handler)
		w.raw(`">`)
		w.esc(e.EventID)
		w.raw("</a></td>\n")
		if inboxSrc {
			w.raw("<td>")
			w.esc(e.Handler)
			w.raw("</td>")
		}
		w.raw("<td>")
		w.esc(e.Topic)
		w.raw("</td><td>")
		w.esc(e.EventType)
		w.raw("</td><td><code>")
		w.esc(e.Key)
		w.raw("</code></td><td>")
		w.num(int64(e.Attempts))
		w.raw("</td>\n", `<td title="`)
		w.stamp(e.DeadAt)
		w.raw(`">`)
		w.ago(p.Now, e.DeadAt)
		w.raw(`</td><td class="reason">`)
		w.esc(e.LastError)
		w.raw("</td>\n</tr>")
	}
	if len(d.List) == 0 {
		w.raw(`<tr><td colspan="8">no dead letters match</td></tr>`)
	}
	w.raw("</tbody>\n</table></div>\n")
	if len(d.List) > 0 {
		postForm(w, p, "act", ` class="card bulk" id="bulk"`)
		w.raw("\n  <h2>Act on this filter</h2>\n  ")
		w.hidden("csrf", p.CSRF)
		w.hidden("step", "review")
		w.raw("\n  ")
		for _, kv := range f.Fields() {
			w.hidden(kv[0], kv[1])
		}
		w.raw("\n", `  <p class="sub">A dry run comes first: it shows exactly which events would change, then asks to confirm.`)
		if f.Q != "" {
			w.raw(" A search matches an event id or a key: filter by one of them to act.")
		}
		w.raw("</p>\n",
			`  <label class="opt"><input type="radio" name="op" value="requeue" checked> requeue (back to pending, attempts reset)</label>`, "\n",
			`  <label class="opt"><input type="radio" name="op" value="purge"> purge (delete) dead for at least <input name="older_than" value="0s" size="6"></label>`, "\n  ")
		if len(f.query()) == 2 {
			w.raw(`<label class="opt"><input type="checkbox" name="all" value="1"> every dead letter (no filter)</label>`)
		}
		w.raw("\n  ")
		actorInput(w, p.Actor)
		w.raw("\n", `  <label>Reason <input name="reason" maxlength="2000" placeholder="why (audited)" required></label>`, "\n",
			`  <button id="bulk-review">Dry run…</button>`, "\n</form>")
	}
	w.raw("\n")
	foot(w, p)
}

func eventPage(w *hw, p *page, d *deadDetailData) {
	e := d.Event
	head(w, p)
	dt := func(term string) {
		w.raw("<dt>", term, "</dt><dd>")
	}
	w.raw("\n", `<dl class="kv" id="event">`, "\n  ")
	dt("source")
	w.esc(string(e.Source))
	w.raw("</dd>\n", `  <dt>status</dt><dd class="s-`)
	w.esc(e.Status)
	w.raw(`" id="status">`)
	w.esc(e.Status)
	w.raw("</dd>\n  ")
	if e.Handler != "" {
		dt("handler")
		w.esc(e.Handler)
		if len(e.OtherHandlers) > 0 {
			w.raw(" (also: ")
			for _, h := range e.OtherHandlers {
				w.raw(`<a href="`)
				w.href(p, eventPath(string(e.Source), e.EventID), "handler", h)
				w.raw(`">`)
				w.esc(h)
				w.raw("</a> ")
			}
			w.raw(")")
		}
		w.raw("</dd>\n  ")
		dt("dedup key")
		w.raw("<code>")
		w.esc(e.DedupKey)
		w.raw("</code> (")
		w.esc(e.KeyStrategy)
		w.raw(")</dd>")
	}
	w.raw("\n  ")
	dt("topic")
	w.esc(e.Topic)
	w.raw("</dd>")
	dt("type")
	w.esc(e.EventType)
	w.raw("</dd>")
	dt("key")
	w.raw("<code>")
	w.esc(e.Key)
	w.raw("</code></dd>\n  ")
	dt("attempts")
	w.num(int64(e.Attempts))
	if e.Deferrals != 0 {
		w.raw(" · ")
		w.num(int64(e.Deferrals))
		w.raw(" deferrals")
	}
	w.raw("</dd>\n  ")
	if e.WaitingFor != "" {
		dt("waiting for")
		w.esc(e.WaitingFor)
		w.raw("</dd>")
	}
	w.raw("\n  ")
	dt("occurred")
	w.stamp(e.OccurredAt)
	w.raw("</dd>\n  ")
	if e.ReceivedAt != nil {
		dt("received")
		w.stamp(e.ReceivedAt)
		w.raw("</dd>")
	}
	w.raw("\n  ")
	if e.CreatedAt != nil {
		dt("created")
		w.stamp(e.CreatedAt)
		w.raw(" (partition ")
		w.num(int64(e.Partition))
		w.raw(")</dd>")
	}
	w.raw("\n  ")
	if e.DeadAt != nil {
		if e.Status == "dead" {
			dt("dead")
		} else {
			dt("finished")
		}
		w.stamp(e.DeadAt)
		w.raw(" (")
		w.ago(p.Now, e.DeadAt)
		w.raw(")</dd>")
	}
	w.raw("\n  ")
	if e.LastError != "" {
		w.raw(`<dt>error</dt><dd class="reason">`)
		w.esc(e.LastError)
		w.raw("</dd>")
	}
	w.raw("\n</dl>\n<h2>Payload")
	if e.PayloadEncoding == "base64" {
		w.raw(" (base64)")
	}
	w.raw("</h2>\n", `<pre class="payload" id="payload">`)
	w.esc(d.Payload)
	w.raw("</pre>\n")
	if len(d.Headers) > 0 {
		w.raw(`<h2>Headers</h2><div class="scroll"><table><tbody>`)
		for _, h := range d.Headers {
			w.raw("<tr><th>")
			w.esc(h.K)
			w.raw("</th><td><code>")
			w.esc(h.V)
			w.raw("</code></td></tr>")
		}
		w.raw("</tbody></table></div>")
	}
	w.raw("\n")
	if e.Status == "dead" {
		postForm(w, p, "act", ` class="card" id="act"`)
		w.raw("\n  <h2>Act on this event</h2>\n  ")
		w.hidden("csrf", p.CSRF)
		w.hidden("step", "review")
		w.raw("\n  ")
		w.hidden("source", string(e.Source))
		w.hidden("event_id", e.EventID)
		w.raw("\n  ")
		if e.Handler != "" {
			w.hidden("handler", e.Handler)
		}
		w.raw("\n", `  <label class="opt"><input type="radio" name="op" value="requeue" checked> requeue</label>`, "\n",
			`  <label class="opt"><input type="radio" name="op" value="purge"> purge</label>`, "\n  ")
		if e.Handler != "" {
			w.raw(`<label class="opt"><input type="radio" name="op" value="skip-dead"> skip (an ordered key parked behind it goes on; it stays dead)</label>`)
		}
		w.raw("\n  ")
		actorInput(w, p.Actor)
		w.raw("\n", `  <label>Reason <input name="reason" id="reason" maxlength="2000" placeholder="why (audited)" required></label>`, "\n",
			`  <button id="review">Review…</button>`, "\n</form>")
	}
	w.raw("\n<h2>History</h2>\n")
	auditTable(w, p, d.Audit)
	w.raw("\n")
	foot(w, p)
}

func orderedPage(w *hw, p *page, d orderedData) {
	head(w, p)
	getForm(w, p, "ordered", ` class="filters"`)
	w.raw("\n", `  <label>Handler <input name="handler" value="`)
	w.esc(d.Handler)
	w.raw(`"></label><button>Filter</button>`, "\n", `  <a href="`)
	w.href(p, "conflicts", "handler", d.Handler)
	w.raw(`">key conflicts</a>`, "\n</form>\n",
		`<p class="sub">Keys of ordered handlers whose events wait: a <b>gap</b> waits for a sequence that never arrived; a <b>parked</b> key waits behind a dead event; <b>behind</b> keys wait for one in flight.</p>`, "\n",
		`<div class="scroll"><table id="keys">`, "\n",
		`<thead><tr><th>handler</th><th>key</th><th>state</th><th>applied</th><th>waiting for</th><th>held</th><th>oldest</th><th></th></tr></thead>`,
		"\n<tbody>")
	for _, k := range d.Keys {
		w.raw("<tr>\n<td>")
		w.esc(k.Handler)
		w.raw("</td><td><code>")
		w.esc(k.Key)
		w.raw(`</code></td><td class="k-`)
		w.esc(k.State)
		w.raw(`">`)
		w.esc(k.State)
		w.raw("</td><td>")
		w.num(k.LastApplied)
		w.raw("</td><td>")
		w.num(k.WaitingFor)
		w.raw("</td><td>")
		w.num(k.Held)
		if k.FirstHeld != 0 {
			w.raw(" (from ")
			w.num(k.FirstHeld)
			w.raw(")")
		}
		w.raw("</td><td>")
		w.ago(p.Now, k.Oldest)
		w.raw("</td>\n<td>")
		switch k.State {
		case "gap":
			postForm(w, p, "act", ` class="inline"`)
			w.raw("\n  ")
			w.hidden("csrf", p.CSRF)
			w.hidden("step", "review")
			w.hidden("op", "skip-gap")
			w.raw("\n  ")
			w.hidden("source", "inbox")
			w.hidden("handler", k.Handler)
			w.hidden("gap_key", k.Key)
			w.raw("\n  ")
			actorInput(w, p.Actor)
			w.raw(`<input name="reason" placeholder="why (audited)" required><button>Skip gap…</button></form>`, "\n")
		case "parked":
			w.raw(`<a href="`)
			w.href(p, "dead", "source", "inbox", "handler", k.Handler, "key", k.Key)
			w.raw(`">dead event</a>`)
		}
		w.raw("</td>\n</tr>")
	}
	if len(d.Keys) == 0 {
		w.raw(`<tr><td colspan="8">no key waits</td></tr>`)
	}
	w.raw("</tbody></table></div>\n")
	foot(w, p)
}

func conflictsPage(w *hw, p *page, d conflictsData) {
	head(w, p)
	w.raw(`<p class="sub">A delivery whose dedup key was already stored with a different payload: the stored event's effect stands; the conflicting one was not processed.</p>`, "\n")
	for _, c := range d.List {
		w.raw(`<section class="card conflict">`, "\n  <h2>")
		w.esc(c.Handler)
		w.raw(" · key <code>")
		w.esc(c.DedupKey)
		w.raw("</code> (")
		w.esc(c.KeyStrategy)
		w.raw(")</h2>\n", `  <p class="sub">detected `)
		w.ago(p.Now, c.DetectedAt)
		w.raw(" · ")
		w.esc(c.Topic)
		w.raw(" ")
		w.esc(c.EventType)
		w.raw("</p>\n", `  <div class="side">`, "\n", `    <div><h3>stored: <a href="`)
		w.href(p, eventPath("inbox", c.StoredEventID), "handler", c.Handler)
		w.raw(`">`)
		w.esc(c.StoredEventID)
		w.raw("</a></h3>\n      ")
		if c.StoredMissing != "" {
			w.raw(`<p class="warn">`)
			w.esc(c.StoredMissing)
			w.raw("</p>")
		} else {
			w.raw(`<pre class="payload">`)
			w.esc(c.Stored)
			w.raw("</pre>")
		}
		w.raw(`<p class="sub">fingerprint `)
		w.esc(c.StoredFingerprint)
		w.raw("</p></div>\n    <div><h3>conflicting: ")
		w.esc(c.EventID)
		w.raw(`</h3><pre class="payload">`)
		w.esc(c.Incoming)
		w.raw(`</pre><p class="sub">fingerprint `)
		w.esc(c.Fingerprint)
		w.raw("</p></div>\n  </div>\n</section>")
	}
	if len(d.List) == 0 {
		w.raw("<p>No key conflicts recorded.</p>")
	}
	w.raw("\n")
	foot(w, p)
}

func relayPage(w *hw, p *page, d relayData) {
	head(w, p)
	w.raw("<h2>Relays</h2>\n", `<div class="scroll"><table id="relays"><thead><tr><th>relay</th><th>alive</th><th>last seen</th><th>partitions</th></tr></thead><tbody>`, "\n")
	var relays []admin.RelayNode
	var parts []admin.Partition
	if d.Outbox != nil {
		relays, parts = d.Outbox.Relays, d.Outbox.Partitions
	}
	for _, n := range relays {
		w.raw("<tr><td>")
		w.esc(n.NodeID)
		if n.Alive {
			w.raw(`</td><td class="ok">alive`)
		} else {
			w.raw(`</td><td class="s-dead">gone`)
		}
		w.raw("</td><td>")
		w.ago(p.Now, n.LastSeen)
		w.raw("</td><td>")
		w.num(int64(n.Partitions))
		w.raw("</td></tr>\n")
	}
	if len(relays) == 0 {
		w.raw(`<tr><td colspan="4">no relay has run against this database</td></tr>`)
	}
	w.raw("</tbody></table></div>\n<h2>Partitions</h2>\n",
		`<div class="scroll"><table id="partitions"><thead><tr><th>partition</th><th>owner</th><th>epoch</th><th>lease expires</th><th>pending</th><th>lag</th><th>dead</th></tr></thead><tbody>`, "\n")
	for _, pt := range parts {
		w.raw("<tr><td>")
		w.num(int64(pt.Partition))
		w.raw("</td><td>")
		if pt.Held {
			w.esc(pt.Owner)
		} else {
			w.raw("<i>free</i>")
		}
		w.raw("</td><td>")
		w.num(pt.Epoch)
		w.raw("</td><td>")
		if pt.LeaseUntil != nil {
			w.ago(p.Now, pt.LeaseUntil)
		} else {
			w.raw("never held")
		}
		w.raw("</td>\n<td>")
		w.num(pt.Pending)
		w.raw("</td><td>")
		w.secs(pt.LagSeconds)
		w.raw("</td><td>")
		if pt.Dead > 0 {
			w.raw(`<a href="`)
			w.href(p, "dead", "source", "outbox")
			w.raw(`">`)
			w.num(pt.Dead)
			w.raw("</a>")
		} else {
			w.raw("0")
		}
		w.raw("</td></tr>\n")
	}
	if len(parts) == 0 {
		w.raw(`<tr><td colspan="7">no partitions</td></tr>`)
	}
	w.raw("</tbody></table></div>\n<h2>Broker against the dedup window</h2>\n", `<dl class="kv" id="broker">`, "\n  <dt>dedup window</dt><dd>")
	if d.DedupWindow != 0 {
		w.esc(fmtDur(d.DedupWindow))
	} else {
		w.raw("not known to this process (the consumer's --dedup-window)")
	}
	w.raw("</dd>\n  ")
	if b := d.Broker; b != nil {
		w.raw("<dt>")
		w.esc(b.Kind)
		w.raw("</dt><dd>")
		w.esc(b.Name)
		w.raw("</dd><dt>max age</dt><dd>")
		if b.MaxAge != 0 {
			w.esc(fmtDur(b.MaxAge))
		} else {
			w.raw("unlimited")
		}
		w.raw("</dd>\n  <dt>duplicate window</dt><dd>")
		if b.DuplicateWindow != 0 {
			w.esc(fmtDur(b.DuplicateWindow))
		} else {
			w.raw("—")
		}
		w.raw("</dd>")
		for _, o := range b.Other {
			w.raw("<dt>")
			w.esc(o[0])
			w.raw("</dt><dd>")
			w.esc(o[1])
			w.raw("</dd>")
		}
	}
	w.raw("\n  ")
	if d.BrokerError != "" {
		w.raw(`<dt>broker</dt><dd class="warn">`)
		w.esc(d.BrokerError)
		w.raw("</dd>")
	}
	w.raw("\n  ")
	if d.Broker == nil && d.BrokerError == "" {
		w.raw("<dt>broker</dt><dd>this process does not report its broker's retention</dd>")
	}
	w.raw("\n</dl>\n")
	for _, a := range d.Advice {
		w.raw(`<p class="advice`)
		if a.OK {
			w.raw(" fine")
		}
		w.raw(`">`)
		w.esc(a.Text)
		w.raw("</p>")
	}
	w.raw("\n")
	foot(w, p)
}

func confirmPage(w *hw, p *page, d confirmData) {
	head(w, p)
	w.raw("\n")
	if res := d.Result; res != nil {
		w.raw("\n", `<p class="big" id="dry-run">Dry run: `)
		w.num(int64(res.Count))
		w.raw(" event(s) would be ")
		w.esc(d.Verb)
		w.raw("d")
		if res.More {
			w.raw(" (the limit, ")
			w.num(int64(res.Limit))
			w.raw(": more may match; repeat after)")
		}
		w.raw(".</p>\n")
		if len(res.Events) > 0 {
			w.raw(`<div class="scroll"><table><thead><tr><th>event</th><th>handler</th><th>attempts</th><th>error</th></tr></thead><tbody>`, "\n")
			for _, e := range res.Events {
				w.raw("<tr><td>")
				w.esc(e.EventID)
				w.raw("</td><td>")
				w.esc(e.Handler)
				w.raw("</td><td>")
				w.num(int64(e.PreviousAttempts))
				w.raw(`</td><td class="reason">`)
				w.esc(e.PreviousError)
				w.raw("</td></tr>")
			}
			w.raw("</tbody></table></div>")
		}
		w.raw("\n")
	}
	w.raw("\n")
	if e := d.Event; e != nil {
		w.raw(`<p class="big">Skip dead event `)
		w.esc(e.EventID)
		w.raw(" of handler ")
		w.esc(e.Handler)
		w.raw(" (key <code>")
		w.esc(e.Key)
		w.raw("</code>)? Its key's later events run; it stays dead.</p>")
	}
	w.raw("\n")
	if k := d.Key; k != nil {
		w.raw(`<p class="big">Skip the gap of key <code>`)
		w.esc(k.Key)
		w.raw("</code> (handler ")
		w.esc(k.Handler)
		w.raw("): give up on sequences ")
		w.num(k.WaitingFor)
		w.raw("…")
		if k.FirstHeld != 0 {
			w.num(k.FirstHeld)
		}
		w.raw("; ")
		w.num(k.Held)
		w.raw(" held event(s) run.</p>")
	}
	w.raw("\n<p>Recorded in the audit table as <b>")
	w.esc(d.Req.Actor)
	w.raw("</b>")
	if d.Req.Reason != "" {
		w.raw(", reason “")
		w.esc(d.Req.Reason)
		w.raw("”")
	}
	w.raw(".</p>\n")
	if d.Confirm != "" {
		postForm(w, p, "act", ` class="card" id="confirm"`)
		w.raw("\n  ")
		w.hidden("csrf", p.CSRF)
		w.hidden("step", "run")
		w.hidden("confirm", d.Confirm)
		w.raw("\n  ")
		for _, kv := range d.Req.Fields() {
			w.hidden(kv[0], kv[1])
		}
		w.raw("\n", `  <button id="confirm-run" class="danger">Confirm: `)
		w.esc(d.Verb)
		w.raw(`</button> <a href="`)
		w.href(p, d.Back.path, d.Back.query...)
		w.raw(`">cancel</a>`, "\n</form>")
	} else {
		w.raw(`<p>Nothing to do. <a href="`)
		w.href(p, d.Back.path, d.Back.query...)
		w.raw(`">Back</a></p>`)
	}
	w.raw("\n")
	foot(w, p)
}

func donePage(w *hw, p *page, d doneData) {
	head(w, p)
	w.raw("\n")
	if res := d.Result; res != nil {
		w.raw(`<p class="big ok" id="done">`)
		w.num(int64(res.Count))
		w.raw(" event(s) ")
		w.esc(d.Verb)
		w.raw("d")
		if res.More {
			w.raw(" (the limit: more may match)")
		}
		w.raw(".</p>\n", `<div class="scroll"><table><thead><tr><th>event</th><th>handler</th><th>audit</th></tr></thead><tbody>`, "\n")
		for _, e := range res.Events {
			w.raw("<tr><td>")
			w.esc(e.EventID)
			w.raw("</td><td>")
			w.esc(e.Handler)
			w.raw("</td><td>#")
			w.num(e.AuditID)
			w.raw("</td></tr>")
		}
		w.raw("</tbody></table></div>")
	}
	w.raw("\n")
	if s := d.Skip; s != nil {
		w.raw(`<p class="big ok" id="done">Skipped key `)
		w.esc(s.Key)
		w.raw(": sequences ")
		w.num(s.From)
		w.raw("–")
		w.num(s.To)
		w.raw("; ")
		w.num(s.Woken)
		w.raw(" waiting event(s) woken.</p>")
	}
	w.raw("\n", `<p><a href="`)
	w.href(p, d.Back.path, d.Back.query...)
	w.raw(`" id="back">Back</a> · <a href="`)
	w.href(p, d.Audit.path, d.Audit.query...)
	w.raw(`">audit</a></p>`, "\n")
	foot(w, p)
}
