package pgrelay

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/db"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// TestGateHandsBackWhatAClaimRaceLetThrough: events of one key claimed
// together by a claim that ignored their order (two racing claims can do
// that) still apply strictly in sequence: the gate runs sequence 1, hands
// sequence 3 back unrun (2 is missing) and hands a second sequence 1 back
// too (its twin's effect has not committed yet); the next batch absorbs it.
func TestGateHandsBackWhatAClaimRaceLetThrough(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := context.Background()
	var ran []int64
	w, err := NewInboxWorker(InboxConfig{Pool: pool, Ordered: true, HandlerName: DefaultHandlerName,
		Handler: HandlerFunc(func(_ context.Context, _ pgx.Tx, ev *InboxEvent) error {
			ran = append(ran, ev.KeySeq)
			return nil
		})})
	require.NoError(t, err)
	msg := func(id string, seq int64) Incoming {
		return Incoming{Message: Message{EventID: id, Topic: "t", Key: "k", KeySeq: seq, EventType: "T", Payload: []byte(`{}`)}}
	}
	_, err = Receive(ctx, pool, []Incoming{msg("s3", 3), msg("s1", 1), msg("s1-again", 1)})
	require.NoError(t, err)

	// The unordered claim takes all three at once.
	rows, err := db.New().ClaimInbox(ctx, pool, db.ClaimInboxParams{Handler: DefaultHandlerName, MaxAttempts: 5,
		WorkerID: "w", Lease: interval(time.Minute), BatchSize: 10})
	require.NoError(t, err)
	require.Len(t, rows, 3)
	cs := make([]claimed, len(rows))
	for i, r := range rows {
		cs[i] = fromClaimRow(r)
	}
	require.NoError(t, w.processBatch(ctx, w.claimedEvents(cs, false)))

	require.Equal(t, []int64{1}, ran, "the handler ran out of sequence")
	status := func(id string) string {
		var s string
		require.NoError(t, pool.QueryRow(ctx, `SELECT status FROM pgrelay.inbox WHERE event_id = $1`, id).Scan(&s))
		return s
	}
	require.Equal(t, "processed", status("s1"))
	require.Equal(t, "pending", status("s3"), "sequence 3 must be handed back")
	require.Equal(t, "pending", status("s1-again"), "absorbed before its twin committed")
	var last int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT last_applied FROM pgrelay.inbox_key_state WHERE key = 'k'`).Scan(&last))
	require.EqualValues(t, 1, last)

	// The next batch absorbs it, without running the handler.
	again, err := w.claim(ctx)
	require.NoError(t, err)
	require.Len(t, again, 1)
	require.NoError(t, w.processBatch(ctx, again))
	require.Equal(t, "processed", status("s1-again"))
	require.Equal(t, []int64{1}, ran)
}
