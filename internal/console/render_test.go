package console

import (
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
