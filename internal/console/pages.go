package console

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/admin"
)

// page is what every page gets.
type page struct {
	Title   string
	Program string
	Nav     string
	CSRF    string
	Signed  bool // signed in with the token (sign-out shown)
	Actor   string
	// Refresh, when set, reloads the page every so many seconds.
	Refresh int
	Now     time.Time
	Errors  []string
	// Database is the database the request named ("": none, the first),
	// carried by every console link of the page (url); Databases lists
	// those served when there are several (a selector).
	Database  string
	Databases []string
	// write writes the whole page (show binds a page function to its data).
	write func(*hw, *page)
}

func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, name, title string, write func(*hw, *page)) {
	c.renderPage(w, r, status, name, &page{Title: title, write: write})
}

func (c *Console) renderPage(w http.ResponseWriter, r *http.Request, status int, name string, p *page) {
	p.Program = c.cfg.Program
	p.Nav = name
	p.CSRF = c.csrf()
	p.Signed = c.cfg.Token != "" && c.authenticated(r)
	p.Now = c.cfg.Now()
	p.Actor = actor(r)
	if d := r.URL.Query().Get("database"); d != "" {
		if _, ok := c.cfg.Databases.Service(d); ok {
			p.Database = d // an unknown one's 404 page links to the default
		}
	}
	if names := c.cfg.Databases.Names(); len(names) > 1 {
		p.Databases = names
	}
	var buf hw
	p.write(&buf, p)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, buf.String())
}

// fail renders an operation's error: a bad request, a missing event, or
// (logged) anything else.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, err error) {
	status := http.StatusInternalServerError
	switch {
	case errors.Is(err, admin.ErrInvalid):
		status = http.StatusBadRequest
	case errors.Is(err, admin.ErrStale):
		status = http.StatusConflict
	case errors.Is(err, admin.ErrNotFound):
		status = http.StatusNotFound
	case errors.Is(err, admin.ErrUnsupported):
		status = http.StatusNotImplemented
	default:
		c.cfg.Logger.Error("console request failed", slog.Any("error", err), slog.String("path", r.URL.Path))
	}
	c.render(w, r, status, "error", http.StatusText(status), show(errorPage, errorData{Status: status, Message: err.Error()}))
}

// ---- overview

type overviewData struct {
	Stats      *admin.Stats
	Dedup      *admin.DedupReport
	Throughput []admin.ThroughputSeries
	Handlers   []handlerRow
	Process    []processSeries
	Covered    time.Duration
	HasProcess bool
	Outbox     *admin.ThroughputSeries
	Retries    []int64
	Dead       []int64
	// RetriesTotal and DeadTotal add up Retries and Dead.
	RetriesTotal, DeadTotal int64
	DedupHours              []int64
	// Databases are those served with their schema versions, as GET
	// /v1/databases lists them.
	Databases []admin.DatabaseStatus
	// ProcessDatabase names the database whose series the process charts
	// show when several are served ("": one, the process's series).
	ProcessDatabase string
}

type handlerRow struct {
	admin.HandlerStats
	Processed []int64
	Total     int64
	Retries   *processSeries
	DeadProc  *processSeries
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	p := &page{Title: "Overview", Refresh: 30}
	d := &overviewData{}
	var err error
	if d.Stats, err = svc(ctx).Stats(ctx); err != nil {
		p.Errors = append(p.Errors, "stats: "+err.Error())
	}
	if d.Dedup, err = svc(ctx).Dedup(ctx, 10); err != nil {
		p.Errors = append(p.Errors, "dedup: "+err.Error())
	} else {
		for _, h := range d.Dedup.Hourly {
			d.DedupHours = append(d.DedupHours, h.Duplicates)
		}
	}
	if d.Throughput, err = svc(ctx).Throughput(ctx, 60); err != nil {
		p.Errors = append(p.Errors, "throughput: "+err.Error())
	}
	d.Databases = c.cfg.Databases.Status(ctx)
	if len(d.Databases) > 1 {
		d.ProcessDatabase = database(ctx)
	}
	d.HasProcess = c.cfg.Gatherer != nil
	d.Process, d.Covered = c.samples.perMinute(c.cfg.Now(), 60, d.ProcessDatabase)
	d.Retries, d.Dead = make([]int64, 60), make([]int64, 60)
	for _, ps := range d.Process {
		var into []int64
		switch ps.Label {
		case "retries", "publish errors":
			into = d.Retries
		case "dead":
			into = d.Dead
		}
		for i, v := range ps.Minutes {
			if into != nil {
				into[i] += v
			}
		}
		switch ps.Label {
		case "retries", "publish errors":
			d.RetriesTotal += sum(ps.Minutes)
		case "dead":
			d.DeadTotal += sum(ps.Minutes)
		}
	}
	byHandler := map[string]*admin.ThroughputSeries{}
	for i := range d.Throughput {
		t := &d.Throughput[i]
		if t.Source == admin.SourceOutbox {
			d.Outbox = t
		} else {
			byHandler[t.Handler] = t
		}
	}
	if d.Stats != nil {
		for _, h := range d.Stats.Inbox.Handlers {
			row := handlerRow{HandlerStats: h, Processed: make([]int64, 60)}
			if t := byHandler[h.Handler]; t != nil {
				row.Processed, row.Total = throughputCounts(t.Minutes), t.Total
			}
			for i := range d.Process {
				ps := &d.Process[i]
				if ps.Handler != h.Handler {
					continue
				}
				switch ps.Label {
				case "retries":
					row.Retries = ps
				case "dead":
					row.DeadProc = ps
				}
			}
			d.Handlers = append(d.Handlers, row)
		}
	}
	p.write = show(overviewPage, d)
	c.renderPage(w, r, http.StatusOK, "overview", p)
}

func sum(v []int64) int64 {
	var n int64
	for _, x := range v {
		n += x
	}
	return n
}

func throughputCounts(m []admin.ThroughputMinute) []int64 {
	out := make([]int64, len(m))
	for i, v := range m {
		out[i] = v.Count
	}
	return out
}

// ---- dead letters

// filterForm is a dead-letter filter as URL (or form) parameters: the same
// names as the admin API's, plus q (an event id or a key) and source.
type filterForm struct {
	Source  string
	Q       string
	Handler string
	EventID string
	Topic   string
	Type    string
	Key     string
	Error   string
	Since   string
	Until   string
	Limit   string
}

func readFilter(v url.Values) filterForm {
	f := filterForm{Source: v.Get("source"), Q: strings.TrimSpace(v.Get("q")), Handler: v.Get("handler"),
		EventID: v.Get("event_id"), Topic: v.Get("topic"), Type: v.Get("type"), Key: v.Get("key"),
		Error: v.Get("error"), Since: v.Get("since"), Until: v.Get("until"), Limit: v.Get("limit")}
	if f.Source == "" {
		f.Source = string(admin.SourceInbox)
	}
	return f
}

// Fields lists the non-empty parameters, for hidden inputs.
func (f filterForm) Fields() [][2]string {
	var out [][2]string
	for _, kv := range [][2]string{{"source", f.Source}, {"q", f.Q}, {"handler", f.Handler}, {"event_id", f.EventID},
		{"topic", f.Topic}, {"type", f.Type}, {"key", f.Key}, {"error", f.Error}, {"since", f.Since},
		{"until", f.Until}, {"limit", f.Limit}} {
		if kv[1] != "" {
			out = append(out, kv)
		}
	}
	return out
}

// query is Fields as the query pairs of page.url, for stable links.
func (f filterForm) query() []string {
	var out []string
	for _, kv := range f.Fields() {
		out = append(out, kv[0], kv[1])
	}
	return out
}

// filters turns the form into admin filters: one, or two when q searches
// both the event id and the key.
func (f filterForm) filters(now time.Time) ([]admin.Filter, error) {
	base := admin.Filter{Handler: f.Handler, EventID: f.EventID, Topic: f.Topic, EventType: f.Type, Key: f.Key, ErrorContains: f.Error}
	for _, t := range []struct {
		name, v string
		dst     **time.Time
	}{{"since", f.Since, &base.DeadAfter}, {"until", f.Until, &base.DeadBefore}} {
		if t.v == "" {
			continue
		}
		at, err := parseWhen(t.v, now)
		if err != nil {
			return nil, fmt.Errorf("%w: %s=%q: want an RFC 3339 time, a date-time (2006-01-02T15:04) or a duration ago (24h)", admin.ErrInvalid, t.name, t.v)
		}
		*t.dst = &at
	}
	if f.Limit != "" {
		n, err := strconv.Atoi(f.Limit)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%w: limit=%q: want a non-negative integer", admin.ErrInvalid, f.Limit)
		}
		base.Limit = n
	}
	if f.Q == "" {
		return []admin.Filter{base}, nil
	}
	byID, byKey := base, base
	byID.EventID, byKey.Key = f.Q, f.Q
	return []admin.Filter{byID, byKey}, nil
}

func parseWhen(v string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(v); err == nil {
		return now.Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	return time.ParseInLocation("2006-01-02T15:04", v, time.UTC)
}

type deadListData struct {
	Filter   filterForm
	List     []admin.DeadLetter
	Counts   map[string]int64
	Limit    int
	Handlers []string
}

// listDead runs the form's filters and merges their results (q matches an
// event id or a key).
func (c *Console) listDead(r *http.Request, f filterForm) ([]admin.DeadLetter, error) {
	filters, err := f.filters(c.cfg.Now())
	if err != nil {
		return nil, err
	}
	var out []admin.DeadLetter
	seen := map[string]bool{}
	for _, flt := range filters {
		list, err := svc(r.Context()).ListDead(r.Context(), admin.Source(f.Source), flt)
		if err != nil {
			return nil, err
		}
		for _, d := range list {
			id := d.Handler + "\x00" + d.EventID
			if !seen[id] {
				seen[id] = true
				out = append(out, d)
			}
		}
	}
	return out, nil
}

func (c *Console) deadList(w http.ResponseWriter, r *http.Request) {
	f := readFilter(r.URL.Query())
	list, err := c.listDead(r, f)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	d := &deadListData{Filter: f, List: list}
	p := &page{Title: "Dead letters", write: show(deadPage, d)}
	if st, err := svc(r.Context()).Stats(r.Context()); err == nil {
		d.Counts = map[string]int64{"inbox": st.Inbox.ByStatus["dead"], "outbox": st.Outbox.ByStatus["dead"]}
		for _, h := range st.Inbox.Handlers {
			d.Handlers = append(d.Handlers, h.Handler)
		}
	} else {
		p.Errors = append(p.Errors, "stats: "+err.Error())
	}
	c.renderPage(w, r, http.StatusOK, "dead", p)
}

type deadDetailData struct {
	Event   *admin.DeadLetter
	Audit   []admin.AuditEntry
	Payload string
	Headers []kv
	Waiting *pgrelay.WaitingKey
}

type kv struct{ K, V string }

func (c *Console) deadDetail(w http.ResponseWriter, r *http.Request) {
	src := admin.Source(r.PathValue("source"))
	ev, err := svc(r.Context()).Show(r.Context(), src, r.PathValue("id"), r.URL.Query().Get("handler"))
	if err != nil {
		c.fail(w, r, err)
		return
	}
	d := &deadDetailData{Event: ev, Payload: prettyPayload(ev.Payload, ev.PayloadEncoding)}
	for k, v := range ev.Headers {
		d.Headers = append(d.Headers, kv{k, v})
	}
	sortKV(d.Headers)
	p := &page{Title: "Event " + ev.EventID, write: show(eventPage, d)}
	if d.Audit, err = svc(r.Context()).Audit(r.Context(), ev.EventID, src, 50); err != nil {
		p.Errors = append(p.Errors, "audit: "+err.Error())
	}
	c.renderPage(w, r, http.StatusOK, "event", p)
}

// ---- ordered keys and conflicts

type orderedData struct {
	Handler string
	Keys    []pgrelay.WaitingKey
}

func (c *Console) ordered(w http.ResponseWriter, r *http.Request) {
	h := r.URL.Query().Get("handler")
	keys, err := svc(r.Context()).Waiting(r.Context(), h, 500)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	c.render(w, r, http.StatusOK, "ordered", "Ordered keys", show(orderedPage, orderedData{Handler: h, Keys: keys}))
}

type conflictRow struct {
	admin.Conflict
	Stored        string
	StoredMissing string
	Incoming      string
}

type conflictsData struct {
	Handler, EventID string
	List             []conflictRow
}

func (c *Console) conflicts(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	d := conflictsData{Handler: q.Get("handler"), EventID: q.Get("event_id")}
	list, err := svc(r.Context()).ListConflicts(r.Context(), d.Handler, d.EventID, 100)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	for _, cf := range list {
		row := conflictRow{Conflict: cf, Incoming: prettyPayload(cf.Payload, cf.PayloadEncoding)}
		stored, err := svc(r.Context()).Show(r.Context(), admin.SourceInbox, cf.StoredEventID, cf.Handler)
		if err != nil {
			row.StoredMissing = err.Error()
		} else {
			row.Stored = prettyPayload(stored.Payload, stored.PayloadEncoding)
		}
		d.List = append(d.List, row)
	}
	c.render(w, r, http.StatusOK, "conflicts", "Key conflicts", show(conflictsPage, d))
}

// ---- relay

type relayData struct {
	Outbox      *admin.OutboxOverview
	Broker      *BrokerSettings
	BrokerError string
	DedupWindow time.Duration
	Advice      []advice
}

// advice is one line of the relay page's comparison; OK when nothing needs
// doing.
type advice struct {
	Text string
	OK   bool
}

func (c *Console) relay(w http.ResponseWriter, r *http.Request) {
	ov, err := svc(r.Context()).Outbox(r.Context())
	if err != nil {
		c.fail(w, r, err)
		return
	}
	d := relayData{Outbox: ov, DedupWindow: c.cfg.DedupWindow}
	if c.cfg.Broker != nil {
		if d.Broker, err = c.cfg.Broker(r.Context()); err != nil {
			d.BrokerError = err.Error()
		}
	}
	d.Advice = advise(d.Broker, d.DedupWindow)
	c.render(w, r, http.StatusOK, "relay", "Relay", show(relayPage, d))
}

// advise compares the broker's retention with the dedup window.
func advise(b *BrokerSettings, window time.Duration) []advice {
	if b == nil || window == 0 {
		return nil
	}
	var out []advice
	switch {
	case b.MaxAge == 0:
		out = append(out, advice{Text: fmt.Sprintf("%s %s keeps messages forever: longer than the dedup window %s, so a replay from the start could apply old events twice; set its max age to at most %s", b.Kind, b.Name, fmtDur(window), fmtDur(window))})
	case b.MaxAge > window:
		out = append(out, advice{Text: fmt.Sprintf("the dedup window %s is shorter than the %s's max age %s: a replay could apply events twice; raise --dedup-window or lower the max age", fmtDur(window), b.Kind, fmtDur(b.MaxAge))})
	default:
		out = append(out, advice{Text: fmt.Sprintf("the %s keeps messages %s, within the dedup window %s", b.Kind, fmtDur(b.MaxAge), fmtDur(window)), OK: true})
	}
	if b.DuplicateWindow > window {
		out = append(out, advice{Text: fmt.Sprintf("the broker's duplicate window %s is longer than the dedup window %s", fmtDur(b.DuplicateWindow), fmtDur(window))})
	}
	return out
}

// ---- audit

type auditData struct {
	EventID, Source string
	List            []admin.AuditEntry
}

func (c *Console) audit(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	d := auditData{EventID: q.Get("event_id"), Source: q.Get("source")}
	limit := 200
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			c.fail(w, r, fmt.Errorf("%w: limit=%q: want a non-negative integer", admin.ErrInvalid, v))
			return
		}
		limit = n
	}
	list, err := svc(r.Context()).Audit(r.Context(), d.EventID, admin.Source(d.Source), limit)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	d.List = list
	c.render(w, r, http.StatusOK, "audit", "Audit", show(auditPage, d))
}

// ---- formatting

func prettyPayload(s, enc string) string {
	if enc != "text" || s == "" {
		return s
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, []byte(s), "", "  "); err == nil {
		return buf.String()
	}
	return s
}

func sortKV(s []kv) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j].K < s[j-1].K; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

func stamp(t any) string {
	switch v := t.(type) {
	case time.Time:
		if v.IsZero() {
			return "—"
		}
		return v.UTC().Format("2006-01-02 15:04:05Z")
	case *time.Time:
		if v == nil || v.IsZero() {
			return "—"
		}
		return v.UTC().Format("2006-01-02 15:04:05Z")
	}
	return ""
}

func ago(now time.Time, t any) string {
	var at time.Time
	switch v := t.(type) {
	case time.Time:
		at = v
	case *time.Time:
		if v == nil {
			return "—"
		}
		at = *v
	}
	if at.IsZero() {
		return "—"
	}
	d := now.Sub(at)
	if d < 0 {
		return "in " + fmtDur(-d)
	}
	return fmtDur(d) + " ago"
}

func fmtDur(d time.Duration) string {
	switch {
	case d < time.Second:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	default:
		return fmt.Sprintf("%dd%02dh", int(d.Hours())/24, int(d.Hours())%24)
	}
}
