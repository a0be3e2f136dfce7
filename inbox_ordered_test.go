package pgrelay_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/db"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// seqObserver counts sequence outcomes.
type seqObserver struct {
	pgrelay.NopObserver
	mu sync.Mutex
	n  map[pgrelay.SeqOutcome]int
}

func (o *seqObserver) Sequence(out pgrelay.SeqOutcome, n int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n == nil {
		o.n = map[pgrelay.SeqOutcome]int{}
	}
	o.n[out] += n
}

func (o *seqObserver) get(out pgrelay.SeqOutcome) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n[out]
}

// applyLog is a handler that records, in the handler's transaction, each
// event it applies: only committed applies are in the table, in commit order.
func applyLog(t *testing.T, pool *pgxpool.Pool, poison func(*pgrelay.InboxEvent) bool) pgrelay.InboxHandler {
	t.Helper()
	_, err := pool.Exec(context.Background(),
		`CREATE TABLE applied (n bigserial PRIMARY KEY, key text NOT NULL, seq bigint NOT NULL, event_id text NOT NULL)`)
	require.NoError(t, err)
	return pgrelay.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
		if poison != nil && poison(ev) {
			return pgrelay.Permanent(errors.New("poison"))
		}
		_, err := tx.Exec(ctx, `INSERT INTO applied (key, seq, event_id) VALUES ($1, $2, $3)`, ev.Key, ev.KeySeq, ev.EventID)
		return err
	})
}

// appliedSeqs returns the sequences applied for key, in apply order.
func appliedSeqs(t *testing.T, pool *pgxpool.Pool, key string) []int64 {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT seq FROM applied WHERE key = $1 ORDER BY n`, key)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	return out
}

func seqMsg(id, key string, seq int64) pgrelay.Incoming {
	return pgrelay.Incoming{Message: pgrelay.Message{EventID: id, Topic: "orders", Key: key, KeySeq: seq,
		EventType: "Step", Payload: []byte(fmt.Sprintf(`{"seq":%d}`, seq))}}
}

func orderedConfig(t *testing.T, pool *pgxpool.Pool, h pgrelay.InboxHandler, obs pgrelay.InboxObserver) pgrelay.InboxConfig {
	cfg := fastConfig(t, pool, h)
	cfg.Ordered = true
	cfg.GapTimeout = 300 * time.Millisecond
	cfg.Observer = obs
	return cfg
}

func waitSeqs(t *testing.T, pool *pgxpool.Pool, key string, want []int64) {
	t.Helper()
	require.Eventually(t, func() bool {
		got := appliedSeqs(t, pool, key)
		return len(got) >= len(want)
	}, 20*time.Second, 20*time.Millisecond, "key %s: want %v applied", key, want)
	require.Equal(t, want, appliedSeqs(t, pool, key), "key %s applied out of order or more than once", key)
}

func waitingKey(t *testing.T, pool *pgxpool.Pool, key string) (pgrelay.WaitingKey, bool) {
	t.Helper()
	ks, err := pgrelay.ListWaiting(context.Background(), pool, pgrelay.DefaultHandlerName, 100)
	require.NoError(t, err)
	for _, k := range ks {
		if k.Key == key {
			return k, true
		}
	}
	return pgrelay.WaitingKey{}, false
}

// TestOrderedAppliesReversedDuplicatedAndGappedInSequence delivers one key's
// events in reverse, one twice, one as a second event with an already used
// sequence, and one not at all: the key applies in sequence exactly once up to
// the gap, holds the rest (visible as waiting for the missing sequence),
// reports the gap after the timeout, then drains when it arrives. Another key
// and an event without a sequence flow meanwhile.
func TestOrderedAppliesReversedDuplicatedAndGappedInSequence(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	obs := &seqObserver{}
	startWorker(t, orderedConfig(t, pool, applyLog(t, pool, nil), obs))

	// Reversed, one batch at a time, without sequence 4.
	for _, seq := range []int64{6, 5, 3, 3, 2, 1} {
		receive(t, pool, seqMsg(fmt.Sprintf("k1-%d", seq), "k1", seq))
	}
	// A different event carrying an applied sequence: a duplicate sequence.
	receive(t, pool, seqMsg("k1-2-again", "k1", 2))
	// Another key, in order, and an unsequenced event: they flow.
	receive(t, pool, seqMsg("k2-1", "k2", 1), seqMsg("k2-2", "k2", 2), seqMsg("k2-3", "k2", 3),
		pgrelay.Incoming{Message: pgrelay.Message{EventID: "free", Topic: "orders", Key: "free", EventType: "Step", Payload: []byte(`{}`)}})

	waitSeqs(t, pool, "k1", []int64{1, 2, 3})
	waitSeqs(t, pool, "k2", []int64{1, 2, 3})
	waitSeqs(t, pool, "free", []int64{0})
	waitStatus(t, pool, "k1-2-again", "processed", 10*time.Second)
	require.Contains(t, inboxRow(t, pool, "k1-2-again").LastError, "duplicate key sequence 2")

	// The gap: 5 and 6 wait for 4, visible, and are reported after the timeout.
	var k pgrelay.WaitingKey
	require.Eventually(t, func() bool {
		var ok bool
		k, ok = waitingKey(t, pool, "k1")
		return ok && k.Reported != nil
	}, 10*time.Second, 20*time.Millisecond, "the gap was never reported")
	require.Equal(t, "gap", k.State)
	require.EqualValues(t, 3, k.LastApplied)
	require.EqualValues(t, 4, k.WaitingFor)
	require.EqualValues(t, 2, k.Held)
	require.EqualValues(t, 5, k.FirstHeld)
	// The scan counts the report just after the statement that marks it commits.
	require.Eventually(t, func() bool { return obs.get(pgrelay.SeqGapReported) > 0 }, 5*time.Second, 10*time.Millisecond)
	require.Equal(t, 1, obs.get(pgrelay.SeqGapReported))
	require.Contains(t, inboxRow(t, pool, "k1-5").LastError, "waiting for key sequence 4")
	require.Equal(t, "pending", inboxRow(t, pool, "k1-6").Status)
	require.Equal(t, []int64{1, 2, 3}, appliedSeqs(t, pool, "k1"), "held events ran")

	// The missing event arrives: the key drains in order.
	receive(t, pool, seqMsg("k1-4", "k1", 4))
	waitSeqs(t, pool, "k1", []int64{1, 2, 3, 4, 5, 6})
	waitAllDone(t, pool, 10*time.Second)
	_, waiting := waitingKey(t, pool, "k1")
	require.False(t, waiting)
	require.Equal(t, 9, obs.get(pgrelay.SeqApplied)) // 6 of k1, 3 of k2
	require.Equal(t, 1, obs.get(pgrelay.SeqDuplicate))
	require.Equal(t, 1, obs.get(pgrelay.SeqUnsequenced))
	require.Equal(t, 0, obs.get(pgrelay.SeqOutOfOrder))
}

// TestOrderedClaimNeverTakesALaterSequenceWhileAnEarlierIsUnapplied checks the
// claim itself: while sequence 1 of a key is claimed and not applied,
// sequence 2 is not handed out, however often claims run; another key's
// event is.
func TestOrderedClaimNeverTakesALaterSequenceWhileAnEarlierIsUnapplied(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	receive(t, pool, seqMsg("a-2", "a", 2), seqMsg("a-1", "a", 1), seqMsg("a-3", "a", 3))
	claim := func() []string {
		rows, err := db.New().ClaimInboxOrdered(context.Background(), pool, db.ClaimInboxOrderedParams{
			Handler: pgrelay.DefaultHandlerName, MaxAttempts: 5, WorkerID: "test",
			Lease: pgtype.Interval{Microseconds: time.Minute.Microseconds(), Valid: true}, BatchSize: 10,
		})
		require.NoError(t, err)
		var got []string
		for _, r := range rows {
			got = append(got, r.EventID)
		}
		return got
	}
	require.Equal(t, []string{"a-1"}, claim(), "a later sequence was claimed before an earlier one was applied")
	receive(t, pool, seqMsg("b-1", "b", 1))
	require.Equal(t, []string{"b-1"}, claim(), "a-2 was claimed while a-1 was in flight")
	require.Empty(t, claim())
}

// TestOrderedPoisonParksTheKeyAndRequeueResumesIt: a poison event in the
// middle of a key goes dead and parks the key (its later events wait,
// visible as parked); other keys flow; requeueing it resumes the key in order.
func TestOrderedPoisonParksTheKeyAndRequeueResumesIt(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	var cured sync.Map
	h := applyLog(t, pool, func(ev *pgrelay.InboxEvent) bool {
		_, ok := cured.Load(ev.EventID)
		return ev.EventID == "p-2" && !ok
	})
	obs := &seqObserver{}
	startWorker(t, orderedConfig(t, pool, h, obs))

	receive(t, pool, seqMsg("p-1", "p", 1), seqMsg("p-2", "p", 2), seqMsg("p-3", "p", 3), seqMsg("p-4", "p", 4))
	waitStatus(t, pool, "p-2", "dead", 10*time.Second)
	receive(t, pool, seqMsg("q-1", "q", 1), seqMsg("q-2", "q", 2))
	waitSeqs(t, pool, "q", []int64{1, 2})

	var k pgrelay.WaitingKey
	require.Eventually(t, func() bool {
		var ok bool
		k, ok = waitingKey(t, pool, "p")
		return ok && k.Held == 2
	}, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, "parked", k.State)
	require.EqualValues(t, 2, k.WaitingFor)
	require.Equal(t, []int64{1}, appliedSeqs(t, pool, "p"))
	require.Equal(t, 1, obs.get(pgrelay.SeqParked))

	// Requeue (as consumer dead requeue does): it runs again, in order.
	cured.Store("p-2", true)
	_, err := pool.Exec(context.Background(),
		`UPDATE pgrelay.inbox SET status = 'pending', attempts = 0, next_attempt_at = now(), finished_at = NULL WHERE event_id = 'p-2'`)
	require.NoError(t, err)
	waitSeqs(t, pool, "p", []int64{1, 2, 3, 4})
}

// TestOrderedSkipDeadAndSkipGap: an operator skips a dead event parking a key,
// and a gap; each is audited, the key resumes after it, and a skipped sequence
// arriving late is absorbed without running.
func TestOrderedSkipDeadAndSkipGap(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	h := applyLog(t, pool, func(ev *pgrelay.InboxEvent) bool { return ev.EventID == "d-2" })
	obs := &seqObserver{}
	startWorker(t, orderedConfig(t, pool, h, obs))
	ctx := context.Background()
	op := pgrelay.Skip{Handler: pgrelay.DefaultHandlerName, Actor: "alice", Reason: "test"}

	// A dead event: skip it.
	receive(t, pool, seqMsg("d-1", "d", 1), seqMsg("d-2", "d", 2), seqMsg("d-3", "d", 3))
	waitStatus(t, pool, "d-2", "dead", 10*time.Second)
	_, err := pgrelay.SkipGap(ctx, pool, op, "d")
	require.ErrorIs(t, err, pgrelay.ErrNoGap, "a dead event is not a gap")
	_, err = pgrelay.SkipDead(ctx, pool, op, "d-1")
	require.ErrorIs(t, err, pgrelay.ErrNotParked)
	res, err := pgrelay.SkipDead(ctx, pool, op, "d-2")
	require.NoError(t, err)
	require.Equal(t, pgrelay.SkipResult{Key: "d", From: 2, To: 2, Woken: res.Woken}, res)
	waitSeqs(t, pool, "d", []int64{1, 3})

	// A gap: skip it; the late event is absorbed.
	receive(t, pool, seqMsg("g-1", "g", 1), seqMsg("g-4", "g", 4), seqMsg("g-5", "g", 5))
	waitSeqs(t, pool, "g", []int64{1})
	require.Eventually(t, func() bool { _, ok := waitingKey(t, pool, "g"); return ok }, 10*time.Second, 20*time.Millisecond)
	res, err = pgrelay.SkipGap(ctx, pool, op, "g")
	require.NoError(t, err)
	require.Equal(t, int64(2), res.From)
	require.Equal(t, int64(3), res.To)
	waitSeqs(t, pool, "g", []int64{1, 4, 5})
	receive(t, pool, seqMsg("g-2", "g", 2))
	waitStatus(t, pool, "g-2", "processed", 10*time.Second)
	require.Equal(t, []int64{1, 4, 5}, appliedSeqs(t, pool, "g"))

	require.Equal(t, 2, queryInt(t, pool,
		`SELECT count(*) FROM pgrelay.replay_audit WHERE action IN ('skip_gap', 'skip_dead') AND actor = 'alice' AND handler = 'default'`))
	require.Equal(t, 1, queryInt(t, pool, `SELECT count(*) FROM pgrelay.replay_audit WHERE event_id = 'g#2-3'`))
	require.Eventually(t, func() bool {
		return obs.get(pgrelay.SeqGapSkipped) == 1 && obs.get(pgrelay.SeqDeadSkipped) == 1
	}, 10*time.Second, 20*time.Millisecond, "skips not counted from the audit trail")
	require.Equal(t, 1, obs.get(pgrelay.SeqDuplicate), "the late skipped event was not absorbed")
	_, err = pgrelay.SkipGap(ctx, pool, pgrelay.Skip{Handler: "default"}, "g")
	require.Error(t, err)
	require.True(t, strings.Contains(err.Error(), "actor"))
}

// TestOrderedUnderRetriesAndConcurrency: many keys, their events shuffled
// across batches, four workers and a handler that fails transiently now and
// then: every key applies 1..n exactly once, in order.
func TestOrderedUnderRetriesAndConcurrency(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	var mu sync.Mutex
	failed := map[string]bool{}
	h := applyLog(t, pool, nil)
	flaky := pgrelay.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
		mu.Lock()
		// Every third event fails its first attempt.
		fail := ev.KeySeq%3 == 0 && !failed[ev.EventID]
		failed[ev.EventID] = true
		mu.Unlock()
		if fail {
			return errors.New("transient")
		}
		return h.Handle(ctx, tx, ev)
	})
	cfg := orderedConfig(t, pool, flaky, &seqObserver{})
	cfg.Workers, cfg.BatchSize = 4, 7
	startWorker(t, cfg)

	const keys, per = 20, 15
	var msgs []pgrelay.Incoming
	for k := range keys {
		for s := 1; s <= per; s++ {
			msgs = append(msgs, seqMsg(fmt.Sprintf("c%d-%d", k, s), fmt.Sprintf("c%d", k), int64(s)))
		}
	}
	// A fixed shuffle, received in batches of 9.
	for i := range msgs {
		j := (i*7919 + 13) % len(msgs)
		msgs[i], msgs[j] = msgs[j], msgs[i]
	}
	for i := 0; i < len(msgs); i += 9 {
		receive(t, pool, msgs[i:min(i+9, len(msgs))]...)
	}
	want := make([]int64, per)
	for i := range want {
		want[i] = int64(i + 1)
	}
	for k := range keys {
		waitSeqs(t, pool, fmt.Sprintf("c%d", k), want)
	}
	waitAllDone(t, pool, 10*time.Second)
}

// TestOrderedSameSequenceTwiceInOneBatch: two events carrying the same
// sequence of one key are claimed in one batch. The second is not absorbed
// before the first committed: when the first goes dead, the second applies in
// its place and the key goes on; when the first commits, the second is then
// absorbed as a duplicate sequence. The key's state never counts a sequence
// whose effect did not commit, and no event is lost silently.
func TestOrderedSameSequenceTwiceInOneBatch(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	h := applyLog(t, pool, func(ev *pgrelay.InboxEvent) bool { return ev.EventID == "s-2a" })
	cfg := orderedConfig(t, pool, h, &seqObserver{})
	cfg.Workers = 1
	startWorker(t, cfg)

	receive(t, pool, seqMsg("s-1", "s", 1), seqMsg("t-1", "t", 1))
	waitSeqs(t, pool, "s", []int64{1})
	waitSeqs(t, pool, "t", []int64{1})
	// One statement: the next claim holds both events of sequence 2 of each key.
	receive(t, pool, seqMsg("s-2a", "s", 2), seqMsg("s-2b", "s", 2), seqMsg("s-3", "s", 3),
		seqMsg("t-2a", "t", 2), seqMsg("t-2b", "t", 2), seqMsg("t-3", "t", 3))

	appliedIDs := func(key string) []string {
		rows, err := pool.Query(context.Background(), `SELECT event_id FROM applied WHERE key = $1 ORDER BY n`, key)
		require.NoError(t, err)
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return out
	}
	waitSeqs(t, pool, "s", []int64{1, 2, 3})
	require.Equal(t, []string{"s-1", "s-2b", "s-3"}, appliedIDs("s"), "the second event of sequence 2 applies in place of the dead first")
	require.Equal(t, "dead", inboxRow(t, pool, "s-2a").Status)
	waitSeqs(t, pool, "t", []int64{1, 2, 3})
	require.Equal(t, []string{"t-1", "t-2a", "t-3"}, appliedIDs("t"))
	waitStatus(t, pool, "t-2b", "processed", 10*time.Second)
	require.Contains(t, inboxRow(t, pool, "t-2b").LastError, "duplicate key sequence 2")
	require.Equal(t, 3, queryInt(t, pool, `SELECT last_applied::int FROM pgrelay.inbox_key_state WHERE key = 's'`))
}

// TestOrderedAbsorbedDuplicateCountsAsDelivered: an ordered handler keyed by
// content hash. A key's second event with the same payload (a double click)
// is absorbed at receive and never stored with its sequence; it must count as
// delivered, or the key's next sequence waits for it for ever (reported as a
// gap). Covered: the original before the duplicate, in separate and in one
// Receive; the duplicate's sequence before the original's (the original
// stored first at the later sequence: it moves to the earlier one, where its
// effect belongs, before the events between them); the original in another
// key; the original dead, then skipped.
func TestOrderedAbsorbedDuplicateCountsAsDelivered(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	h := applyLog(t, pool, func(ev *pgrelay.InboxEvent) bool { return ev.EventID == "d-1" })
	startWorker(t, orderedConfig(t, pool, h, &seqObserver{}))
	targets := []pgrelay.Target{{Handler: pgrelay.DefaultHandlerName, DedupKey: "content-hash"}}
	msg := func(id, key string, seq int64, payload string) pgrelay.Incoming {
		return pgrelay.Incoming{Message: pgrelay.Message{EventID: id, Topic: "orders", Key: key, KeySeq: seq,
			EventType: "Paid", Payload: []byte(payload)}}
	}
	recv := func(msgs ...pgrelay.Incoming) pgrelay.ReceiveResult {
		t.Helper()
		res, err := pgrelay.ReceiveFor(context.Background(), pool, targets, msgs)
		require.NoError(t, err)
		return res
	}

	// The original first, the duplicate in a later Receive.
	recv(msg("a-1", "a", 1, `{"pay":"a"}`))
	require.Len(t, recv(msg("a-2", "a", 2, `{"pay":"a"}`)).Absorbed, 1)
	recv(msg("a-3", "a", 3, `{"refund":"a"}`))
	// Both in one Receive.
	recv(msg("b-1", "b", 1, `{"pay":"b"}`), msg("b-2", "b", 2, `{"pay":"b"}`), msg("b-3", "b", 3, `{"refund":"b"}`))
	// The original stored first, at the later sequence: it moves to the
	// earlier one, and its own counts as absorbed; the event between them
	// (e-2) applies after it, as produced.
	recv(msg("c-2", "c", 2, `{"pay":"c"}`), msg("c-3", "c", 3, `{"refund":"c"}`))
	recv(msg("c-1", "c", 1, `{"pay":"c"}`))
	recv(msg("e-3", "e", 3, `{"pay":"e"}`), msg("e-2", "e", 2, `{"cancel":"e"}`))
	recv(msg("e-1", "e", 1, `{"pay":"e"}`))
	// The original belongs to another key.
	recv(msg("x-1", "x", 1, `{"pay":"xy"}`))
	recv(msg("y-1", "y", 1, `{"pay":"xy"}`), msg("y-2", "y", 2, `{"refund":"y"}`))

	waitSeqs(t, pool, "a", []int64{1, 3})
	waitSeqs(t, pool, "b", []int64{1, 3})
	waitSeqs(t, pool, "c", []int64{1, 3})
	waitSeqs(t, pool, "e", []int64{1, 2})
	require.Equal(t, "e-3", queryString(t, pool, `SELECT event_id FROM applied WHERE key = 'e' ORDER BY n LIMIT 1`),
		"the payment applies before the cancel, as produced")
	waitSeqs(t, pool, "x", []int64{1})
	waitSeqs(t, pool, "y", []int64{2})
	for _, k := range []string{"a", "b", "c"} {
		require.Equal(t, 3, queryInt(t, pool, `SELECT last_applied::int FROM pgrelay.inbox_key_state WHERE key = $1`, k), k)
	}

	// The original dead: the key parks on it; skipping it passes the
	// absorbed sequence too.
	recv(msg("d-1", "d", 1, `{"pay":"d"}`), msg("d-2", "d", 2, `{"pay":"d"}`), msg("d-3", "d", 3, `{"refund":"d"}`))
	waitStatus(t, pool, "d-1", "dead", 10*time.Second)
	require.Eventually(t, func() bool { k, ok := waitingKey(t, pool, "d"); return ok && k.State == "parked" },
		10*time.Second, 20*time.Millisecond)
	_, err := pgrelay.SkipDead(context.Background(), pool, pgrelay.Skip{Handler: pgrelay.DefaultHandlerName, Actor: "test"}, "d-1")
	require.NoError(t, err)
	waitSeqs(t, pool, "d", []int64{3})
	waitAllDone(t, pool, 10*time.Second)
	require.Equal(t, 0, queryInt(t, pool, `SELECT count(*)::int FROM pgrelay.inbox_key_state WHERE absorbed_seqs <> '{}'`))
}

// TestAbsorbInboxKeySeqsFolds checks the statement that records absorbed
// sequences: a new key and a key with a state row both move over what follows
// their last applied sequence without a hole and keep the rest; a sequence a
// stored row carries itself is left to it; the next sequence, waiting, is made
// due.
func TestAbsorbInboxKeySeqsFolds(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	h := pgrelay.DefaultHandlerName
	_, err := pool.Exec(ctx, `INSERT INTO pgrelay.inbox_key_state (handler, key, last_applied, absorbed_seqs) VALUES ($1, 'old', 2, '{6}')`, h)
	require.NoError(t, err)
	receive(t, pool, seqMsg("old-4", "old", 4), seqMsg("new-5", "new", 5))
	_, err = pool.Exec(ctx, `UPDATE pgrelay.inbox SET next_attempt_at = 'infinity' WHERE event_id = 'new-5'`)
	require.NoError(t, err)
	woken, err := db.New().AbsorbInboxKeySeqs(ctx, pool, db.AbsorbInboxKeySeqsParams{
		Handlers: []string{h, h, h, h, h, h, h},
		Keys:     []string{"new", "new", "new", "new", "old", "old", "old"},
		Seqs:     []int64{1, 2, 4, 7, 1, 3, 4},
	})
	require.NoError(t, err)
	state := func(key string) (last int64, ahead []int64) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT last_applied, absorbed_seqs FROM pgrelay.inbox_key_state WHERE handler = $1 AND key = $2`,
			h, key).Scan(&last, &ahead))
		return last, ahead
	}
	last, ahead := state("new")
	require.EqualValues(t, 2, last)
	require.Equal(t, []int64{4, 7}, ahead)
	// 3 follows 2; 4 is old-4's own (left to it); 6 stays ahead.
	last, ahead = state("old")
	require.EqualValues(t, 3, last)
	require.Equal(t, []int64{6}, ahead)
	require.Zero(t, woken, "new-5 waits for 3")

	// Filling 3 of "new" reaches 4 (absorbed), so new-5 is due.
	woken, err = db.New().AbsorbInboxKeySeqs(ctx, pool, db.AbsorbInboxKeySeqsParams{
		Handlers: []string{h}, Keys: []string{"new"}, Seqs: []int64{3}})
	require.NoError(t, err)
	require.EqualValues(t, 1, woken)
	last, ahead = state("new")
	require.EqualValues(t, 4, last)
	require.Equal(t, []int64{7}, ahead)
}
