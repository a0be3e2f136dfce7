package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgrelay/pgrelay/broker/nats"
	"github.com/pgrelay/pgrelay/internal/db"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/ledger"
)

// checkInput is what the checker is given besides the database: the events
// the run published straight into the broker, and the events whose producing
// transaction reported a commit.
type checkInput struct {
	pool         *pgxpool.Pool
	readLog      func(context.Context) ([]streamMsg, error) // every message the broker stored, in order
	injected     map[string]expectation
	acknowledged []string
	ordered      bool // the consumers ran with --ordered: check each key's apply order
	// emitted, in a WAL capture run, are the events the producer emitted
	// with pgrelay.Emit or inserted into pgrelay.outbox_wal and saw
	// committed, in commit order: they stand for the outbox rows.
	emitted []emittedEvent
}

// Report is a chaos run's outcome.
type Report struct {
	Seed    uint64
	WorkDir string

	Orders             int            // orders the producer created
	ProducerFailures   int            // producer transactions that failed (and were retried)
	Produced           int            // outbox rows
	Injected           int            // distinct events published straight into the broker
	InjectedDuplicates int            // duplicate deliveries published under new broker ids
	StreamMessages     int            // messages stored in the stream
	InboxRows          int            // distinct events received
	DuplicatesAbsorbed int            // stream messages that were not a new inbox row
	Processed, Dead    int            // inbox outcomes
	Credits            int            // ledger entries
	Retries            int            // attempts beyond the first, from the inbox rows
	Faults             map[string]int // faults by kind
	FaultLog           []faultRecord

	// Counters scraped from the consumers' metrics, summed over restarts (a
	// SIGKILL can lose up to a second of counts), and counted in the logs.
	InboxFenced, InboxFencedLogLines, InboxTakeovers int64
	ScrapedRetries, ScrapedDuplicates                int64
	RelayFenced, RelayTakeovers                      int64 // from the relays' logs
	RelayFencedScraped, RelayTakeoversScraped        int64 // from the relays' metrics
	Restarts                                         int

	DeadLetters []string // "event_id (type): reason"
	Violations  []string

	OrderedKeys int // keys whose apply order was checked (ordered runs)

	// A WAL capture run's events that the producer inserted into
	// pgrelay.outbox_wal (the others it emitted), its transactions that did
	// both, and the rows the relays' TRUNCATEs left in the table at the end.
	WALTableEvents, WALMixedTxs, WALTableLeft int

	// Delayed and expiring events: how many the producer delayed, and how
	// many expired before the relay published them or before a consumer
	// applied them.
	Delayed, ExpiredOutbox, ExpiredInbox int

	// NodeLossStalls are, on a NATS cluster run, the times from each node's
	// SIGKILL until the stream's last sequence moved again, by the killed
	// node's role ("leader", "follower"); -1 when it did not move within 30s.
	NodeLossStalls map[string][]time.Duration
}

// OK reports whether the run found no violation.
func (r *Report) OK() bool { return len(r.Violations) == 0 }

// check reads the final state and records every violated guarantee, naming
// the event.
func check(ctx context.Context, in checkInput) (*Report, error) {
	q := db.New()
	outbox, err := q.ChaosOutboxEvents(ctx, in.pool)
	if err != nil {
		return nil, fmt.Errorf("chaos: read outbox: %w", err)
	}
	if in.emitted != nil {
		if len(outbox) > 0 {
			return nil, fmt.Errorf("chaos: a WAL capture run wrote %d outbox rows", len(outbox))
		}
		// The emitted events, in commit order, play the published outbox
		// rows: each must be in the stream, each key's in this order.
		for i, e := range in.emitted {
			outbox = append(outbox, db.ChaosOutboxEventsRow{ID: int64(i + 1), EventID: e.id, Key: e.key, EventType: e.eventType, Status: "published"})
		}
	}
	inbox, err := q.ChaosInboxEvents(ctx, in.pool)
	if err != nil {
		return nil, fmt.Errorf("chaos: read inbox: %w", err)
	}
	entries, err := q.ChaosLedgerEntries(ctx, in.pool)
	if err != nil {
		return nil, fmt.Errorf("chaos: read ledger entries: %w", err)
	}
	orders, err := q.ChaosLedgerOrders(ctx, in.pool)
	if err != nil {
		return nil, fmt.Errorf("chaos: read ledger orders: %w", err)
	}
	stream, err := in.readLog(ctx)
	if err != nil {
		return nil, err
	}

	rep := &Report{Produced: len(outbox), Injected: len(in.injected), InboxRows: len(inbox), StreamMessages: len(stream), Credits: len(entries)}
	var violations []string
	fail := func(format string, args ...any) { violations = append(violations, fmt.Sprintf(format, args...)) }

	// The relay's first publication of each event: per-key publish order
	// (below) follows the outbox id order (commit order per key), and an
	// event published before it expired may be marked expired after all.
	firstSeq := map[string]uint64{}
	storedAt := map[string]time.Time{} // the broker's time of the first publication, when it tells
	for _, m := range stream {
		if m.msgID != m.eventID {
			continue // a duplicate injected under a new broker id
		}
		if _, seen := firstSeq[m.eventID]; !seen {
			firstSeq[m.eventID] = m.seq
			storedAt[m.eventID] = m.stored
		}
	}
	// What was produced, and what it must become.
	type produced struct {
		eventType string
		expect    expectation
		source    string
	}
	events := map[string]produced{}
	for _, o := range outbox {
		events[o.EventID] = produced{eventType: o.EventType, expect: expectCredit, source: "outbox"}
		switch o.Status {
		case "published":
			// Never published before its time (both times on the
			// database's clock: the claim compares not_before with its
			// now(), and the mark that sets published_at comes after it).
			if o.NotBefore != nil && o.PublishedAt != nil && o.PublishedAt.Before(*o.NotBefore) {
				fail("outbox event %s (key %s) published at %s, before its not_before %s", o.EventID, o.Key,
					o.PublishedAt.Format(time.RFC3339Nano), o.NotBefore.Format(time.RFC3339Nano))
			}
		case "dead":
			if o.LastError != nil && *o.LastError == event.ReasonExpired {
				if o.ExpiresAt == nil {
					fail("outbox event %s (key %s) is dead as expired but has no expires_at", o.EventID, o.Key)
				}
				// Never handed to the broker (a relay notes an expiring row
				// before it publishes it, and a noted row is never marked
				// expired): it must not reach the inbox.
				events[o.EventID] = produced{eventType: o.EventType, expect: expectExpired, source: "outbox"}
			}
			if o.LastError == nil || *o.LastError == "" {
				fail("outbox event %s (key %s) is dead without a reason", o.EventID, o.Key)
			}
		default:
			fail("outbox event %s (key %s) is still %s after the drain", o.EventID, o.Key, o.Status)
		}
	}
	for _, id := range in.acknowledged {
		if _, ok := events[id]; !ok {
			fail("event %s was enqueued in a transaction that committed, but it is not in the outbox", id)
		}
	}
	for id, e := range in.injected {
		events[id] = produced{expect: e, source: "injected"}
	}

	// Every produced event received once and settled; nothing received that
	// was not produced; no live claim left behind.
	inboxByID := map[string]db.ChaosInboxEventsRow{}
	for _, row := range inbox {
		inboxByID[row.EventID] = row
		switch row.Status {
		case "processed":
			rep.Processed++
		case "dead":
			rep.Dead++
			reason := ""
			if row.LastError != nil {
				reason = *row.LastError
			}
			rep.DeadLetters = append(rep.DeadLetters, fmt.Sprintf("%s (%s): %s", row.EventID, orDash(row.EventType), reason))
			if reason == "" {
				fail("inbox event %s is dead without a reason", row.EventID)
			}
		}
		if row.Attempts > 1 {
			rep.Retries += int(row.Attempts - 1)
		}
		if row.LeaseExpired {
			fail("inbox event %s is left processing with an expired lease", row.EventID)
		}
		if _, ok := events[row.EventID]; !ok {
			fail("inbox event %s (%s) was never produced", row.EventID, row.EventType)
		}
		// Never applied after its expiry: the applying transaction's now()
		// (finished_at) precedes the handler's expiry check, which refuses
		// to run an expired event.
		if row.Status == "processed" && row.ExpiresAt != "" {
			exp, err := time.Parse(time.RFC3339Nano, row.ExpiresAt)
			switch {
			case err != nil:
				fail("inbox event %s has an unreadable expiry %q", row.EventID, row.ExpiresAt)
			case row.FinishedAt != nil && row.FinishedAt.After(exp):
				fail("inbox event %s applied at %s, after its expiry %s", row.EventID,
					row.FinishedAt.Format(time.RFC3339Nano), exp.Format(time.RFC3339Nano))
			}
		}
		if row.Status == "dead" && row.LastError != nil && strings.HasPrefix(*row.LastError, event.ReasonExpired) {
			rep.ExpiredInbox++
		}
	}
	for _, c := range inboxCounts(inbox) {
		if c.n > 1 {
			fail("inbox holds event %s %d times", c.id, c.n)
		}
	}
	credits := map[string]int{}
	creditsPerOrder := map[string]int{}
	for _, e := range entries {
		credits[e.EventID]++
		creditsPerOrder[e.OrderID]++
		if _, ok := events[e.EventID]; !ok {
			fail("ledger credit %s (order %s) has no produced event", e.EventID, e.OrderID)
		}
	}
	for order, n := range creditsPerOrder {
		if n > 1 {
			fail("order %s credited %d times", order, n)
		}
	}
	created := map[string]int{}
	for _, o := range orders {
		created[o.EventID]++
		if _, ok := events[o.EventID]; !ok {
			fail("ledger order %s was created by event %s, which was never produced", o.OrderID, o.EventID)
		}
	}
	for id, p := range events {
		row, ok := inboxByID[id]
		switch {
		case p.expect == expectExpired && !ok:
			rep.ExpiredOutbox++
			continue
		case !ok:
			fail("%s event %s (%s) never reached the inbox", p.source, id, orDash(p.eventType))
			continue
		case p.expect == expectExpired:
			if ok {
				fail("outbox event %s expired unpublished (dead), yet reached the inbox", id)
			}
			continue
		case p.expect == expectDead:
			if row.Status != "dead" {
				fail("poison event %s is %s, want dead with a reason", id, row.Status)
			}
			continue
		case row.Status == "dead":
			continue // dead with a reason (checked above) is an allowed end
		case row.Status != "processed":
			fail("%s event %s (%s) is still %s after the drain", p.source, id, row.EventType, row.Status)
			continue
		}
		switch row.EventType {
		case ledger.EventOrderPaid:
			if credits[id] != 1 {
				fail("%s event %s (OrderPaid) processed but credited %d times", p.source, id, credits[id])
			}
		case ledger.EventOrderCreated:
			if created[id] != 1 {
				fail("%s event %s (OrderCreated) processed but created %d ledger orders", p.source, id, created[id])
			}
		}
	}

	unique := map[string]bool{}
	for _, m := range stream {
		if !unique[m.eventID] {
			unique[m.eventID] = true
		}
	}
	rep.DuplicatesAbsorbed = len(stream) - len(unique)
	lastByKey := map[string]struct {
		id  int64
		evt string
		seq uint64
	}{}
	for _, o := range outbox {
		if o.NotBefore != nil {
			rep.Delayed++
		}
		seq, ok := firstSeq[o.EventID]
		if ok && o.NotBefore != nil && !storedAt[o.EventID].IsZero() && storedAt[o.EventID].Before(*o.NotBefore) {
			fail("outbox event %s (key %s) reached the broker at %s, before its not_before %s", o.EventID, o.Key,
				storedAt[o.EventID].Format(time.RFC3339Nano), o.NotBefore.Format(time.RFC3339Nano))
		}
		if ok && o.Status == "dead" && o.LastError != nil && *o.LastError == event.ReasonExpired {
			fail("outbox event %s (key %s) is dead as expired, yet it is in the stream", o.EventID, o.Key)
		}
		if o.Status == "published" && !ok {
			fail("outbox event %s (key %s) is marked published but is not in the stream", o.EventID, o.Key)
			continue
		}
		if !ok {
			continue
		}
		if prev, ok := lastByKey[o.Key]; ok && seq < prev.seq {
			fail("key %s published out of order: event %s (outbox id %d) at stream seq %d before event %s (outbox id %d) at seq %d",
				o.Key, o.EventID, o.ID, seq, prev.evt, prev.id, prev.seq)
		}
		lastByKey[o.Key] = struct {
			id  int64
			evt string
			seq uint64
		}{o.ID, o.EventID, seq}
	}
	if in.ordered {
		order, err := q.ChaosInboxOrder(ctx, in.pool)
		if err != nil {
			return nil, fmt.Errorf("chaos: read inbox order: %w", err)
		}
		rep.OrderedKeys = checkApplyOrder(order, fail)
	}
	sort.Strings(violations)
	rep.Violations = violations
	return rep, nil
}

// checkApplyOrder checks the per-key apply order of an ordered handler (rows
// sorted by handler, key, sequence): each key's sequences are 1, 2, 3, ...
// with none missing or repeated, a sequence is applied only when every earlier
// one is, and never before an earlier one (a later sequence's batch starts
// after the earlier one's committed, so finished_at never goes back). It
// returns how many keys it checked.
func checkApplyOrder(rows []db.ChaosInboxOrderRow, fail func(string, ...any)) int {
	keys := 0
	for i := 0; i < len(rows); {
		j := i
		for j < len(rows) && rows[j].Handler == rows[i].Handler && rows[j].Key == rows[i].Key {
			j++
		}
		keys++
		key := rows[i].Key
		var prevApplied *time.Time
		unapplied := ""
		for n, r := range rows[i:j] {
			want := int64(n + 1)
			if r.KeySeq != want {
				fail("ordered key %s: sequence %d missing or repeated (found %d, event %s)", key, want, r.KeySeq, r.EventID)
				break
			}
			if r.Status != "processed" {
				if unapplied == "" {
					unapplied = fmt.Sprintf("%d (event %s, %s)", r.KeySeq, r.EventID, r.Status)
				}
				continue
			}
			if unapplied != "" {
				fail("ordered key %s: sequence %d (event %s) applied while sequence %s was not", key, r.KeySeq, r.EventID, unapplied)
			}
			if r.FinishedAt != nil {
				if prevApplied != nil && r.FinishedAt.Before(*prevApplied) {
					fail("ordered key %s: sequence %d (event %s) applied at %s, before sequence %d at %s", key, r.KeySeq,
						r.EventID, r.FinishedAt.Format(time.RFC3339Nano), r.KeySeq-1, prevApplied.Format(time.RFC3339Nano))
				}
				prevApplied = r.FinishedAt
			}
		}
		i = j
	}
	return keys
}

type idCount struct {
	id string
	n  int
}

func inboxCounts(rows []db.ChaosInboxEventsRow) []idCount {
	m := map[string]int{}
	for _, r := range rows {
		m[r.EventID]++
	}
	var out []idCount
	for id, n := range m {
		if n > 1 {
			out = append(out, idCount{id, n})
		}
	}
	return out
}

// streamMsg is one stored message's identity.
type streamMsg struct {
	seq            uint64
	subject        string // empty where the broker has none (RabbitMQ)
	msgID, eventID string
	key            string
	stored         time.Time // when the broker stored it; zero when unknown
}

// readStream reads every message stored in the stream, in order.
func readStream(ctx context.Context, js jetstream.JetStream, name string) ([]streamMsg, error) {
	st, err := js.Stream(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("chaos: stream %s: %w", name, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return nil, err
	}
	total := int(info.State.Msgs)
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, err
	}
	out := make([]streamMsg, 0, total)
	for len(out) < total {
		batch, err := cons.Fetch(500, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, fmt.Errorf("chaos: read stream: %w", err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			md, err := m.Metadata()
			if err != nil {
				return nil, err
			}
			h := m.Headers()
			out = append(out, streamMsg{seq: md.Sequence.Stream, subject: m.Subject(), msgID: h.Get(nats.MsgIDHeader), eventID: h.Get(event.HeaderEventID), key: h.Get(event.HeaderKey), stored: md.Timestamp})
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return nil, fmt.Errorf("chaos: read stream: %w", err)
		}
		if n == 0 {
			return nil, fmt.Errorf("chaos: read stream: %d of %d messages, then nothing", len(out), total)
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (r *Report) print(w io.Writer) {
	fmt.Fprintf(w, "\n==================== pgrelay chaos run: report ====================\n")
	fmt.Fprintf(w, "  seed                           %d   (rerun: make chaos SEED=%d)\n", r.Seed, r.Seed)
	fmt.Fprintf(w, "  orders created                 %8d (%d producer transactions failed under faults and were retried)\n", r.Orders, r.ProducerFailures)
	fmt.Fprintf(w, "  events produced (outbox)       %8d\n", r.Produced)
	fmt.Fprintf(w, "  events injected into broker    %8d (out of order and poison)\n", r.Injected)
	fmt.Fprintf(w, "  duplicates injected            %8d (under new broker ids)\n", r.InjectedDuplicates)
	fmt.Fprintf(w, "  messages in the stream         %8d\n", r.StreamMessages)
	fmt.Fprintf(w, "  events received (inbox rows)   %8d\n", r.InboxRows)
	fmt.Fprintf(w, "  duplicates absorbed            %8d stored twice in the stream; the consumers counted %d duplicate deliveries\n",
		r.DuplicatesAbsorbed, r.ScrapedDuplicates)
	fmt.Fprintf(w, "  processed / dead               %8d / %d\n", r.Processed, r.Dead)
	fmt.Fprintf(w, "  ledger credits                 %8d\n", r.Credits)
	fmt.Fprintf(w, "  retries (attempts beyond 1st)  %8d (consumers counted %d handler retries)\n", r.Retries, r.ScrapedRetries)
	fmt.Fprintf(w, "  fenced commits                 %8d inbox (%d logged), %d relay marks logged (%d counted)\n", r.InboxFenced, r.InboxFencedLogLines, r.RelayFenced, r.RelayFencedScraped)
	fmt.Fprintf(w, "  lease takeovers                %8d inbox claims, %d relay partitions logged (%d counted)\n", r.InboxTakeovers, r.RelayTakeovers, r.RelayTakeoversScraped)
	fmt.Fprintf(w, "  service restarts               %8d\n", r.Restarts)
	fmt.Fprintf(w, "  delayed events                 %8d (expired: %d before publishing, %d before applying)\n", r.Delayed, r.ExpiredOutbox, r.ExpiredInbox)
	if r.WALTableEvents > 0 {
		fmt.Fprintf(w, "  of which into outbox_wal       %8d (the others emitted; %d transactions did both; %d rows left after the relays' TRUNCATEs)\n",
			r.WALTableEvents, r.WALMixedTxs, r.WALTableLeft)
	}
	if r.OrderedKeys > 0 {
		fmt.Fprintf(w, "  ordered keys (apply order)     %8d checked\n", r.OrderedKeys)
	}
	total := 0
	for _, n := range r.Faults {
		total += n
	}
	fmt.Fprintf(w, "  faults                         %8d\n", total)
	for _, k := range sortedKeys(r.Faults) {
		fmt.Fprintf(w, "    %-28s %8d\n", k, r.Faults[k])
	}
	if len(r.DeadLetters) > 0 {
		fmt.Fprintf(w, "  dead letters:\n")
		for i, d := range r.DeadLetters {
			if i == 20 {
				fmt.Fprintf(w, "    ... and %d more\n", len(r.DeadLetters)-20)
				break
			}
			fmt.Fprintf(w, "    - %s\n", d)
		}
	}
	if r.OK() {
		fmt.Fprintf(w, "\nRESULT: PASS. Every event applied exactly once or dead with a reason, per-key order kept, nothing left behind.\n")
		return
	}
	fmt.Fprintf(w, "\nRESULT: FAIL, %d violation(s) (logs in %s):\n", len(r.Violations), r.WorkDir)
	for i, v := range r.Violations {
		if i == 50 {
			fmt.Fprintf(w, "  ... and %d more\n", len(r.Violations)-50)
			break
		}
		fmt.Fprintf(w, "  - %s\n", v)
	}
}

func orDash(s string) string {
	if strings.TrimSpace(s) == "" {
		return "-"
	}
	return s
}
