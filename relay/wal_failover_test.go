package relay

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/admin"
	"github.com/pgrelay/pgrelay/internal/testcluster"
	"github.com/pgrelay/pgrelay/internal/testnats"
)

// waitHistory waits until the slot's history on b's server records a
// confirmed position at or past lsn (a number), and returns it as text.
func (b *bundle) waitHistory(t *testing.T, lsn int64) string {
	t.Helper()
	var at string
	require.Eventually(t, func() bool {
		err := b.pool.QueryRow(context.Background(), `SELECT confirmed_lsn::text FROM pgrelay.wal_slot_history
			WHERE slot = $1 AND pg_wal_lsn_diff(confirmed_lsn, '0/0') >= $2`, DefaultWALSlot, lsn).Scan(&at)
		return err == nil
	}, 20*time.Second, 20*time.Millisecond, "the slot's history never reached %d", lsn)
	return at
}

// waitGap waits until r refuses over a gap and returns the message.
func waitGap(t *testing.T, r *engine) string {
	t.Helper()
	var gap string
	require.Eventually(t, func() bool { s, ok := r.WALStatus(); gap = s.Gap; return ok && gap != "" }, 30*time.Second, 20*time.Millisecond,
		"the relay never reported a gap")
	return gap
}

// TestWALFailoverRefusesTheGap: a WAL relay streams from a primary whose
// hot standby replays its WAL (the slot's history with it). The standby stops
// receiving, events commit on the primary only, the primary crashes and the
// standby is promoted: before PostgreSQL 17 the slot is not on it. A relay
// reaching the promoted server through the multi-host URL does not silently
// stream a new slot: it creates one (so that nothing after its start is
// lost), publishes nothing, and reports the gap with its LSN range (the
// history's last confirmed position, the new slot's start) and the time of
// that confirmation. Once an operator accepts the gap (recorded with who
// and why) the same relay streams and publishes new events.
func TestWALFailoverRefusesTheGap(t *testing.T) {
	pair := testcluster.StartPair(t, walConf)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, pair.URL())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	natsURL := testnats.URL(t)
	stream, prefix := testnats.Stream(t, natsURL)
	_, js := testnats.Connect(t, natsURL)
	b := &bundle{pool: pool, dbURL: pair.URL(), natsURL: natsURL, stream: stream, prefix: prefix, js: js}
	ch := b.subscribe(t)

	r1, stop1 := start(t, b.walConfig(t, b.publisher(t), nil))
	waitReading(t, r1)
	at := b.emitAt(t, msgs(3, "k", "a")...)
	readAll(t, ch, 3, 20*time.Second)
	b.waitHistory(t, at)
	stop1()
	require.NoError(t, pair.CatchUp(ctx))
	// What the promoted server will know of the slot: its history.
	var from string
	var confirmedAt time.Time
	require.NoError(t, pool.QueryRow(ctx, `SELECT confirmed_lsn::text, confirmed_at FROM pgrelay.wal_slot_history WHERE slot = $1`,
		DefaultWALSlot).Scan(&from, &confirmedAt))

	require.NoError(t, pair.StopReceiving(ctx))
	b.emit(t, msgs(2, "k", "lost")...) // on the primary only
	require.NoError(t, pair.CrashPrimary(ctx))
	require.NoError(t, pair.Promote(ctx))
	pool.Reset()

	rec := &walStatusRecorder{}
	cfg := b.walConfig(t, b.publisher(t), nil)
	cfg.walObs = rec
	r2, _ := start(t, cfg)
	gap := waitGap(t, r2)
	t.Log(gap)
	var to string
	var active bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT confirmed_flush_lsn::text, active FROM pg_replication_slots WHERE slot_name = $1`,
		DefaultWALSlot).Scan(&to, &active))
	require.False(t, active, "the new slot is not streamed before the gap is accepted")
	require.Contains(t, gap, "events committed after "+from+" (the slot's last confirmed position, recorded at "+
		confirmedAt.UTC().Format(time.RFC3339Nano)+") and before "+to+" (the new slot's start)")
	require.Contains(t, gap, "timeline moved from 1 to 2")
	require.Contains(t, gap, "relay wal accept-gap")
	require.NotEmpty(t, rec.last().Gap, "the observer (relay_wal_gap) saw the gap")
	st, _ := r2.WALStatus()
	require.False(t, st.Reading)

	// The operator accepts the gap.
	svc, err := admin.New(admin.Config{Pool: pool})
	require.NoError(t, err)
	_, err = svc.AcceptWALGap(ctx, admin.WALGapRequest{Slot: DefaultWALSlot, Actor: "alice", Reason: ""})
	require.ErrorIs(t, err, admin.ErrInvalid, "a reason is required")
	g, err := svc.AcceptWALGap(ctx, admin.WALGapRequest{Slot: DefaultWALSlot, Actor: "alice", Reason: "failover; window re-emitted"})
	require.NoError(t, err)
	require.Equal(t, from, g.FromLSN)
	require.Equal(t, to, g.ToLSN)
	var by string
	require.NoError(t, pool.QueryRow(ctx, `SELECT accepted_by FROM pgrelay.wal_gaps WHERE id = $1 AND accepted_at IS NOT NULL`, g.ID).Scan(&by))
	require.Equal(t, "alice", by)
	_, err = svc.AcceptWALGap(ctx, admin.WALGapRequest{Slot: DefaultWALSlot, Actor: "alice", Reason: "again"})
	require.ErrorIs(t, err, admin.ErrInvalid, "no gap left to accept")

	waitReading(t, r2)
	require.Empty(t, rec.last().Gap)
	b.emit(t, msgs(3, "k", "c")...)
	got := readAll(t, ch, 3, 20*time.Second)
	require.Equal(t, []string{"c-0", "c-1", "c-2"}, []string{got[0].eventID, got[1].eventID, got[2].eventID})
}

// TestWALRestartKeepsNoGap: the first relay on a fresh database creates the
// slot without a word; a relay restarted on the same server with its slot
// intact finds its history matching and streams: no gap.
func TestWALRestartKeepsNoGap(t *testing.T) {
	b, _ := walSetup(t, walConf)
	ch := b.subscribe(t)
	r1, stop1 := start(t, b.walConfig(t, b.publisher(t), nil))
	waitReading(t, r1)
	b.waitHistory(t, b.emitAt(t, msgs(2, "k", "a")...))
	readAll(t, ch, 2, 20*time.Second)
	stop1()
	r2, _ := start(t, b.walConfig(t, b.publisher(t), nil))
	waitReading(t, r2)
	b.emit(t, msgs(2, "k", "b")...)
	readAll(t, ch, 2, 20*time.Second)
	var gaps int
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM pgrelay.wal_gaps`).Scan(&gaps))
	require.Zero(t, gaps)
}

// TestWALSlotDroppedWhileStreamingIsAGap: the slot dropped under a streaming
// relay (as a failover to a server without it looks) does not end the
// relay, nor does it stream a new slot: it reports the gap.
func TestWALSlotDroppedWhileStreamingIsAGap(t *testing.T) {
	b, _ := walSetup(t, walConf)
	r, _ := start(t, b.walConfig(t, b.publisher(t), nil))
	waitReading(t, r)
	b.waitHistory(t, b.emitAt(t, msgs(1, "k", "a")...))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.Eventually(t, func() bool {
		_, _ = b.pool.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active`, DefaultWALSlot)
		_, err := b.pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, DefaultWALSlot)
		return err == nil
	}, 20*time.Second, 10*time.Millisecond)
	require.Contains(t, waitGap(t, r), "the slot is missing on this server")
}
