package console

import (
	"cmp"
	"context"
	"crypto/subtle"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/admin"
)

// The actions. Each is reviewed first (requeue and purge as a dry run, the
// skips by showing their target), and runs only with the confirmation token
// the review issued for exactly that request, before it expires. Requeue and
// purge carry the dry run's confirmation (admin.Result.Confirm) too, so they
// act only on exactly the events reviewed; a gap skip carries the gap
// reviewed.
const (
	opRequeue  = "requeue"
	opPurge    = "purge"
	opSkipDead = "skip-dead"
	opSkipGap  = "skip-gap"
)

const actorCookie = "pgrelay_console_actor"

// actRequest is an action as the form posts it.
type actRequest struct {
	Op        string
	Filter    filterForm
	All       bool
	OlderThan string
	// GapKey is the ordered key of skip-gap.
	GapKey string
	Actor  string
	Reason string
	// Reviewed is what the review showed: the dry run's confirmation
	// (requeue, purge) or the gap's sequences (skip-gap).
	Reviewed string
}

func readAct(v url.Values) actRequest {
	return actRequest{Op: v.Get("op"), Filter: readFilter(v), All: v.Get("all") == "1", OlderThan: v.Get("older_than"),
		GapKey: v.Get("gap_key"), Actor: strings.TrimSpace(v.Get("actor")), Reason: strings.TrimSpace(v.Get("reason")),
		Reviewed: v.Get("reviewed")}
}

// Fields are the request's hidden inputs on the confirmation page.
func (a actRequest) Fields() [][2]string {
	out := [][2]string{{"op", a.Op}}
	out = append(out, a.Filter.Fields()...)
	if a.All {
		out = append(out, [2]string{"all", "1"})
	}
	for _, kv := range [][2]string{{"older_than", a.OlderThan}, {"gap_key", a.GapKey}, {"actor", a.Actor}, {"reason", a.Reason}, {"reviewed", a.Reviewed}} {
		if kv[1] != "" {
			out = append(out, kv)
		}
	}
	return out
}

// token binds a confirmation to exactly this request, on this database,
// until expires.
func (c *Console) token(database string, a actRequest, expires int64) string {
	parts := []string{"act", strconv.FormatInt(expires, 10), database}
	for _, f := range a.Fields() {
		parts = append(parts, f[0], f[1])
	}
	return strconv.FormatInt(expires, 10) + "." + c.mac(parts...)
}

// confirmed checks the confirmation token posted with a: 0 when it is
// valid, else the status and why not.
func (c *Console) confirmed(database string, a actRequest, token string) (int, string) {
	exp, _, _ := strings.Cut(token, ".")
	expires, err := strconv.ParseInt(exp, 10, 64)
	if err != nil || subtle.ConstantTimeCompare([]byte(token), []byte(c.token(database, a, expires))) != 1 {
		return http.StatusForbidden, "refused: this action was not reviewed as it stands (review it first; the confirmation is bound to the exact filter, actor and reason)"
	}
	if c.cfg.Now().Unix() >= expires {
		return http.StatusConflict, "refused: the confirmation expired at " + time.Unix(expires, 0).UTC().Format(time.RFC3339) + ": review the action again"
	}
	return 0, ""
}

type confirmData struct {
	Req     actRequest
	Verb    string
	What    string
	Result  *admin.Result
	Event   *admin.DeadLetter
	Key     *pgrelay.WaitingKey
	Confirm string
	Back    link
}

type doneData struct {
	Req    actRequest
	Verb   string
	Result *admin.Result
	Skip   *pgrelay.SkipResult
	Back   link
	Audit  link
}

func verb(op string) string {
	switch op {
	case opRequeue:
		return "requeue"
	case opPurge:
		return "purge"
	default:
		return "skip"
	}
}

// link is a console URL as page.url takes it: a path below Prefix and query
// pairs.
type link struct {
	path  string
	query []string
}

// back is where the action's pages link back to.
func (a actRequest) back() link {
	f := a.Filter
	switch a.Op {
	case opSkipGap:
		return link{"ordered", []string{"handler", f.Handler}}
	case opSkipDead:
		return link{eventPath("inbox", f.EventID), []string{"handler", f.Handler}}
	}
	if f.EventID != "" && f.Q == "" && f.Topic == "" && f.Type == "" && f.Key == "" && f.Error == "" {
		return link{eventPath(f.Source, f.EventID), []string{"handler", f.Handler}}
	}
	return link{"dead", f.query()}
}

func (c *Console) act(w http.ResponseWriter, r *http.Request) {
	a := readAct(r.PostForm)
	switch r.PostForm.Get("step") {
	case "review":
		c.review(w, r, a)
	case "run":
		if status, why := c.confirmed(r.URL.Query().Get("database"), a, r.PostForm.Get("confirm")); status != 0 {
			c.refuse(w, r, status, why)
			return
		}
		c.run(w, r, a)
	default:
		c.fail(w, r, fmt.Errorf("%w: step must be review or run", admin.ErrInvalid))
	}
}

// filter returns the action's one admin filter (q is a search of two: an
// action must name the event id or the key).
func (a actRequest) filter(now time.Time) (admin.Filter, error) {
	if a.Filter.Q != "" {
		return admin.Filter{}, fmt.Errorf("%w: a search (q) matches an event id or a key: act on it by event id or key (event_id=, key=)", admin.ErrInvalid)
	}
	fs, err := a.Filter.filters(now)
	if err != nil {
		return admin.Filter{}, err
	}
	return fs[0], nil
}

func (a actRequest) olderThan() (*time.Duration, error) {
	v := a.OlderThan
	if v == "" {
		v = "0s"
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return nil, fmt.Errorf("%w: older_than=%q: want a duration such as 720h (0s: every match)", admin.ErrInvalid, a.OlderThan)
	}
	return &d, nil
}

// exec runs the action, as a dry run or for real.
func (c *Console) exec(ctx context.Context, a actRequest, dryRun bool) (*admin.Result, *pgrelay.SkipResult, error) {
	src := admin.Source(a.Filter.Source)
	switch a.Op {
	case opRequeue, opPurge:
		f, err := a.filter(c.cfg.Now())
		if err != nil {
			return nil, nil, err
		}
		if a.Op == opRequeue {
			res, err := svc(ctx).Requeue(ctx, src, admin.RequeueRequest{Filter: f, All: a.All, Actor: a.Actor, Reason: a.Reason,
				DryRun: dryRun, Confirm: a.Reviewed})
			return res, nil, err
		}
		older, err := a.olderThan()
		if err != nil {
			return nil, nil, err
		}
		res, err := svc(ctx).Purge(ctx, src, admin.PurgeRequest{Filter: f, OlderThan: older, Actor: a.Actor, Reason: a.Reason,
			DryRun: dryRun, Confirm: a.Reviewed})
		return res, nil, err
	case opSkipDead, opSkipGap:
		if dryRun {
			return nil, nil, nil
		}
		req := admin.SkipRequest{Handler: a.Filter.Handler, Actor: a.Actor, Reason: a.Reason}
		var res pgrelay.SkipResult
		var err error
		if a.Op == opSkipDead {
			req.EventID = a.Filter.EventID
			res, err = svc(ctx).SkipDead(ctx, req)
		} else {
			if gap, gerr := c.gap(ctx, a); gerr != nil || gap != a.Reviewed {
				return nil, nil, cmp.Or(gerr, fmt.Errorf("%w: nothing was skipped: the gap of key %q is now %s, not the %s reviewed; review it again",
					admin.ErrStale, a.GapKey, cmp.Or(gap, "closed"), a.Reviewed))
			}
			req.Key = a.GapKey
			res, err = svc(ctx).SkipGap(ctx, req)
		}
		return nil, &res, err
	}
	return nil, nil, fmt.Errorf("%w: unknown action %q: want requeue, purge, skip-dead or skip-gap", admin.ErrInvalid, a.Op)
}

func (c *Console) review(w http.ResponseWriter, r *http.Request, a actRequest) {
	if a.Actor == "" || a.Reason == "" && a.Op != opPurge {
		c.fail(w, r, fmt.Errorf("%w: who you are (actor) and why (reason) are required: both are written to the audit table", admin.ErrInvalid))
		return
	}
	a.Reviewed = ""
	d := confirmData{Req: a, Verb: verb(a.Op), Back: a.back()}
	res, _, err := c.exec(r.Context(), a, true)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	d.Result = res
	switch a.Op {
	case opSkipDead:
		ev, err := svc(r.Context()).Show(r.Context(), admin.SourceInbox, a.Filter.EventID, a.Filter.Handler)
		if err != nil {
			c.fail(w, r, err)
			return
		}
		d.Event = ev
	case opSkipGap:
		keys, err := svc(r.Context()).Waiting(r.Context(), a.Filter.Handler, 0)
		if err != nil {
			c.fail(w, r, err)
			return
		}
		for i := range keys {
			if keys[i].Key == a.GapKey && keys[i].State == "gap" {
				d.Key = &keys[i]
			}
		}
		if d.Key == nil {
			c.fail(w, r, fmt.Errorf("%w: key %q of handler %q has no gap (any more)", admin.ErrInvalid, a.GapKey, a.Filter.Handler))
			return
		}
	}
	if res != nil {
		d.Req.Reviewed = res.Confirm
	} else if d.Key != nil {
		d.Req.Reviewed = gapRange(d.Key)
	}
	if res == nil || res.Count > 0 {
		d.Confirm = c.token(r.URL.Query().Get("database"), d.Req, c.cfg.Now().Add(svc(r.Context()).ConfirmTTL()).Unix())
	}
	c.render(w, r, http.StatusOK, "confirm", "Confirm "+d.Verb, show(confirmPage, d))
}

func (c *Console) run(w http.ResponseWriter, r *http.Request, a actRequest) {
	res, skip, err := c.exec(r.Context(), a, false)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: actorCookie, Value: url.QueryEscape(a.Actor), Path: Prefix, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil, MaxAge: 90 * 24 * 3600})
	d := doneData{Req: a, Verb: verb(a.Op), Result: res, Skip: skip, Back: a.back()}
	d.Audit = link{"audit", []string{"event_id", a.Filter.EventID}}
	c.render(w, r, http.StatusOK, "done", "Done", show(donePage, d))
}

// gapRange names the sequences a gap skip gives up on.
func gapRange(k *pgrelay.WaitingKey) string {
	return fmt.Sprintf("%d…%d", k.WaitingFor, k.FirstHeld)
}

// gap returns the sequences of a's gap now ("" when the key has none).
func (c *Console) gap(ctx context.Context, a actRequest) (string, error) {
	keys, err := svc(ctx).Waiting(ctx, a.Filter.Handler, 0)
	if err != nil {
		return "", err
	}
	for i := range keys {
		if keys[i].Key == a.GapKey && keys[i].State == "gap" {
			return gapRange(&keys[i]), nil
		}
	}
	return "", nil
}

// actor returns the actor remembered from the last action.
func actor(r *http.Request) string {
	if ck, err := r.Cookie(actorCookie); err == nil {
		if v, err := url.QueryUnescape(ck.Value); err == nil {
			return v
		}
	}
	return ""
}
