package pgrelay

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

func testPolicy() policy {
	return policy{maxAttempts: 5, maxDeferrals: 3, backoffMin: time.Second, backoffMax: 30 * time.Second,
		deferFallback: time.Minute}
}

// TestBackoff: exponential from the floor, capped, jittered within bounds.
func TestBackoff(t *testing.T) {
	t.Parallel()
	lo, hi := func() float64 { return 0 }, func() float64 { return 0.999999 }
	for attempt, want := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second,
		5: 16 * time.Second, 6: 30 * time.Second, 60: 30 * time.Second} {
		require.Equal(t, time.Second, retryDelay(attempt, time.Second, 30*time.Second, lo), "attempt %d floor", attempt)
		require.InDelta(t, float64(want), float64(retryDelay(attempt, time.Second, 30*time.Second, hi)),
			float64(time.Millisecond), "attempt %d ceiling", attempt)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 1000 {
		d := retryDelay(4, time.Second, 30*time.Second, r.Float64)
		require.True(t, d >= time.Second && d <= 8*time.Second, "%s", d)
	}
}

// TestDecide covers every failure transition.
func TestDecide(t *testing.T) {
	t.Parallel()
	p := testPolicy()
	half := func() float64 { return 0.5 }
	boom := errors.New("boom")

	d := decide(p, boom, 1, 0, half)
	require.Equal(t, decision{outcome: outcomeRetry, delay: time.Second, reason: "boom"}, d)
	d = decide(p, boom, 3, 0, half)
	require.Equal(t, outcomeRetry, d.outcome)
	require.Equal(t, 2500*time.Millisecond, d.delay)
	d = decide(p, boom, 5, 0, half)
	require.Equal(t, decision{outcome: outcomeDead, reason: "attempts exhausted: 5 of 5: boom"}, d)
	d = decide(p, fmt.Errorf("wrapped: %w", Permanent(boom)), 1, 0, half)
	require.Equal(t, decision{outcome: outcomeDead, reason: "wrapped: permanent: boom"}, d)
	d = decide(p, Defer("order:1"), 5, 2, half)
	require.Equal(t, decision{outcome: outcomeDefer, delay: time.Minute, waitingFor: "order:1",
		reason: "deferred: waiting for order:1"}, d, "a deferral is not limited by attempts")
	d = decide(p, Defer("order:1"), 1, 3, half)
	require.Equal(t, decision{outcome: outcomeDead,
		reason: "deferrals exhausted: still waiting for order:1 after 3 deferrals"}, d)
	d = decide(p, Defer(""), 1, 0, half)
	require.Equal(t, outcomeDead, d.outcome)
	d = decide(p, Defer("order:\x00"), 1, 0, half)
	require.Equal(t, outcomeDead, d.outcome, "a dependency name PostgreSQL cannot store")

	// Reasons quoting hostile input stay storable as PostgreSQL text.
	d = decide(p, errors.New("bad \x00 byte \xff and "+strings.Repeat("x", 10000)), 1, 0, half)
	require.True(t, utf8.ValidString(d.reason))
	require.NotContains(t, d.reason, "\x00")
	require.LessOrEqual(t, len(d.reason), maxReasonLen+len("…"))
	require.True(t, strings.HasPrefix(d.reason, "bad \\0 byte \uFFFD and xxx"), d.reason)
	require.Nil(t, Permanent(nil))
}

// The model below mirrors the SQL transitions (queries/inbox.sql) over an
// in-memory table and a fake clock, and drives them with decide, an
// at-least-once broker that duplicates, reorders and redelivers, and workers
// that crash mid-batch.

type mRow struct {
	id, typ, order        string
	status                string
	attempts, deferrals   int
	version               int64
	next, leaseUntil      time.Time
	waitingFor, lastError string
}

type model struct {
	p        policy
	now      time.Time
	rows     map[string]*mRow
	releases map[string]bool
	orders   map[string]bool
	credits  map[string]int
	r        *rand.Rand
	dups     int
}

func (m *model) receive(id, typ, order string) {
	if _, ok := m.rows[id]; ok {
		m.dups++
		return
	}
	m.rows[id] = &mRow{id: id, typ: typ, order: order, status: "pending", next: m.now}
}

// claim is ClaimInboxLost (one row) then ClaimInbox (a batch); it returns the
// claimed rows with their claim versions.
func (m *model) claim(batch int, lease time.Duration) []*mRow {
	var lost, due []*mRow
	for _, r := range m.rows {
		switch {
		case r.status == "processing" && r.leaseUntil.Before(m.now):
			lost = append(lost, r)
		case r.status == "pending" && !r.next.After(m.now):
			due = append(due, r)
		}
	}
	byID := func(rs []*mRow) { sort.Slice(rs, func(i, j int) bool { return rs[i].id < rs[j].id }) }
	byID(lost)
	byID(due)
	m.r.Shuffle(len(due), func(i, j int) { due[i], due[j] = due[j], due[i] })
	var out []*mRow
	take := func(r *mRow, lostWorker bool) {
		r.version++
		if r.attempts >= m.p.maxAttempts {
			r.status, r.lastError = "dead", "attempts exhausted"
			if lostWorker {
				r.lastError = fmt.Sprintf("attempts exhausted: worker lost during attempt %d", r.attempts)
			}
			return
		}
		r.status, r.attempts, r.leaseUntil = "processing", r.attempts+1, m.now.Add(lease)
		c := *r
		out = append(out, &c)
	}
	if len(lost) > 0 {
		take(lost[0], true)
		return out
	}
	for _, r := range due[:min(batch, len(due))] {
		take(r, false)
	}
	return out
}

// handle is the ledger's logic plus injected faults.
func (m *model) handle(c *mRow, credits map[string]int, orders map[string]bool, releases map[string]bool) error {
	switch {
	case c.id == "poison":
		return errors.New("poison")
	case m.r.IntN(10) == 0:
		return errors.New("transient")
	case c.typ == "created":
		orders[c.order] = true
		releases["order:"+c.order] = true
		return nil
	case !orders[c.order] && !m.orders[c.order]:
		return Defer("order:" + c.order)
	default:
		credits[c.id]++
		return nil
	}
}

// process runs one claimed batch in one "transaction": effects are staged and
// applied only if the batch commits; crash abandons the batch mid-way.
func (m *model) process(batch []*mRow, crashAt int) {
	credits, orders, releases := map[string]int{}, map[string]bool{}, map[string]bool{}
	type upd struct {
		c *mRow
		d *decision
	}
	var updates []upd
	for i, c := range batch {
		if i == crashAt {
			return // the process died: nothing of the batch commits
		}
		sCredits, sOrders, sReleases := clone(credits), clone(orders), clone(releases)
		err := m.handle(c, sCredits, sOrders, sReleases)
		if err == nil {
			if m.rows[c.id].version != c.version {
				continue // fenced: savepoint rolled back
			}
			credits, orders, releases = sCredits, sOrders, sReleases
			updates = append(updates, upd{c: c})
			continue
		}
		d := decide(m.p, err, c.attempts, c.deferrals, m.r.Float64)
		updates = append(updates, upd{c: c, d: &d})
	}
	// Commit.
	for id, n := range credits {
		m.credits[id] += n
	}
	for o := range orders {
		m.orders[o] = true
	}
	for k := range releases {
		m.releases[k] = true
		for _, r := range m.rows {
			if r.status == "pending" && r.waitingFor == k {
				r.next, r.waitingFor = m.now, ""
			}
		}
	}
	for _, u := range updates {
		r := m.rows[u.c.id]
		if r.version != u.c.version || r.status != "processing" {
			continue // fenced
		}
		switch {
		case u.d == nil:
			r.status = "processed"
		case u.d.outcome == outcomeRetry:
			r.status, r.next, r.lastError = "pending", m.now.Add(u.d.delay), u.d.reason
		case u.d.outcome == outcomeDefer:
			r.status, r.attempts, r.deferrals, r.waitingFor = "pending", r.attempts-1, r.deferrals+1, u.d.waitingFor
			r.next = m.now.Add(u.d.delay)
			if m.releases[u.d.waitingFor] {
				r.next = m.now
			}
		default:
			r.status, r.lastError = "dead", u.d.reason
		}
	}
}

// open counts the rows still pending or processing.
func (m *model) open() int {
	n := 0
	for _, r := range m.rows {
		if r.status == "pending" || r.status == "processing" {
			n++
		}
	}
	return n
}

func clone[K comparable, V any](in map[K]V) map[K]V {
	out := make(map[K]V, len(in))
	for k, v := range in {
		out[k] = v
	}
	return out
}

// TestStateMachineModel drives the inbox state machine through thousands of
// steps under an at-least-once broker (duplicates, reordering, redelivery)
// with transient failures, a poison event and crashing workers, on a fake
// clock, for many seeds: every OrderPaid is credited exactly once, the poison
// ends dead after MaxAttempts, and nothing is left pending or processing.
func TestStateMachineModel(t *testing.T) {
	t.Parallel()
	for seed := uint64(1); seed <= 20; seed++ {
		r := rand.New(rand.NewPCG(seed, 99))
		m := &model{p: testPolicy(), now: time.Unix(0, 0), rows: map[string]*mRow{}, releases: map[string]bool{},
			orders: map[string]bool{}, credits: map[string]int{}, r: r}
		// The broker's queue: every event is delivered until acknowledged,
		// acknowledgements get lost, deliveries come in random order.
		type msg struct{ id, typ, order string }
		var queue []msg
		for o := range 20 {
			order := fmt.Sprintf("o%d", o)
			queue = append(queue, msg{"created-" + order, "created", order})
			for p := range 3 {
				queue = append(queue, msg{fmt.Sprintf("paid-%s-%d", order, p), "paid", order})
			}
		}
		queue = append(queue, msg{"poison", "paid", "o0"})
		paid := 0
		for _, q := range queue {
			if q.typ == "paid" && q.id != "poison" {
				paid++
			}
		}
		m.p.maxAttempts, m.p.maxDeferrals = 10, 10
		const lease = 30 * time.Second
		var stalled [][]*mRow // batches of zombie workers, finished later
		for step := 0; step < 4000; step++ {
			switch k := r.IntN(100); {
			case k < 3 && len(stalled) < 2: // a worker stalls after its claim
				stalled = append(stalled, m.claim(1+r.IntN(8), lease))
			case k < 6 && len(stalled) > 0: // a stalled worker wakes up and finishes its batch
				m.process(stalled[0], -1)
				stalled = stalled[1:]
			case k < 45 && len(queue) > 0: // deliver one message, maybe ack it
				i := r.IntN(len(queue))
				m.receive(queue[i].id, queue[i].typ, queue[i].order)
				if r.IntN(3) > 0 {
					queue = append(queue[:i], queue[i+1:]...)
				}
			case k < 90: // a worker claims and processes a batch, maybe crashing
				batch := m.claim(1+r.IntN(8), lease)
				crashAt := -1
				if r.IntN(20) == 0 && len(batch) > 0 {
					crashAt = r.IntN(len(batch))
				}
				m.process(batch, crashAt)
			default: // time passes
				m.now = m.now.Add(time.Duration(r.IntN(20)) * time.Second)
			}
		}
		// Drain: deliver everything left, then let time and workers run.
		for _, b := range stalled {
			m.process(b, -1)
		}
		for _, q := range queue {
			m.receive(q.id, q.typ, q.order)
		}
		for range 5000 {
			m.now = m.now.Add(5 * time.Second)
			m.process(m.claim(8, lease), -1)
			if m.open() == 0 {
				break
			}
		}

		for id, r := range m.rows {
			switch {
			case id == "poison":
				require.Equal(t, "dead", r.status, "seed %d", seed)
				require.LessOrEqual(t, r.attempts, m.p.maxAttempts, "seed %d", seed)
			default:
				// The seeds are fixed, so the run is deterministic: with these
				// fault rates no healthy event exhausts its attempts.
				require.Equal(t, "processed", r.status, "seed %d %s: %+v", seed, id, r)
			}
			if r.typ == "paid" && r.status == "processed" {
				require.Equal(t, 1, m.credits[id], "seed %d %s credited %d times", seed, id, m.credits[id])
			}
		}
		require.Len(t, m.rows, paid+21, "seed %d: every event stored once", seed)
		require.Zero(t, m.credits["poison"], "seed %d: poison credited", seed)
		require.Positive(t, m.dups, "seed %d: the broker redelivered", seed)
	}
}
