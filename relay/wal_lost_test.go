package relay

import (
	"context"
	"encoding/hex"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/admin"
	"github.com/pgrelay/pgrelay/internal/testcluster"
)

// lostConf makes a slot easy to lose: it may keep 1MB of WAL, and the
// segments a checkpoint frees are removed (not kept for max_wal_size).
const lostConf = "wal_level = logical\nmax_slot_wal_keep_size = '1MB'\nmin_wal_size = '32MB'\nmax_wal_size = '64MB'\n" +
	"wal_sender_timeout = '5s'\nmax_replication_slots = 10\nmax_wal_senders = 10"

// walStatusRecorder records the slot statuses a relay reports.
type walStatusRecorder struct {
	mu       sync.Mutex
	all      []WALSlotStatus
	rejected map[string]int
}

func (o *walStatusRecorder) WALRejected(reason string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.rejected == nil {
		o.rejected = map[string]int{}
	}
	o.rejected[reason]++
}

func (o *walStatusRecorder) rejections() map[string]int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return maps.Clone(o.rejected)
}

func (o *walStatusRecorder) WALSlot(lagBytes int64, lagSeconds float64, reading bool, walStatus string, gap bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := WALSlotStatus{LagBytes: lagBytes, LagSeconds: lagSeconds, Reading: reading, WALStatus: walStatus}
	if gap {
		s.Gap = "a gap"
	}
	o.all = append(o.all, s)
}

func (o *walStatusRecorder) last() WALSlotStatus {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.all) == 0 {
		return WALSlotStatus{}
	}
	return o.all[len(o.all)-1]
}

// loseSlot writes WAL past max_slot_wal_keep_size (non-transactional filler
// messages, each followed by a segment switch) and checkpoints, so that a
// slot held back is invalidated.
func (b *bundle) loseSlot(t *testing.T, ctx context.Context) {
	t.Helper()
	for range 4 {
		_, err := b.pool.Exec(ctx, `SELECT pg_logical_emit_message(false, 'filler', repeat('x', 1024*1024)); SELECT pg_switch_wal()`)
		require.NoError(t, err)
	}
	_, err := b.pool.Exec(ctx, `CHECKPOINT`)
	require.NoError(t, err)
}

// slotRowOf returns the slot's wal_status and confirmed_flush_lsn (as a
// number).
func (b *bundle) slotRowOf(t *testing.T, ctx context.Context, slot string) (walStatus string, confirmed int64) {
	t.Helper()
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT coalesce(wal_status, ''), coalesce(pg_wal_lsn_diff(confirmed_flush_lsn, '0/0'), 0)::bigint
		FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&walStatus, &confirmed))
	return walStatus, confirmed
}

// emitAt writes msgs with Emit in one transaction and returns the WAL
// insert position just before its commit record (a lower bound of the
// commit's position), as a number.
func (b *bundle) emitAt(t *testing.T, msgs ...pgrelay.Message) int64 {
	t.Helper()
	o, err := pgrelay.NewOutbox(pgrelay.OutboxConfig{})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var at int64
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if err := o.Emit(ctx, tx, msgs...); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint`).Scan(&at)
	}))
	return at
}

// TestWALSlotLostWhileStreaming: a relay streams; the broker stops
// acknowledging (the relay stalls, its slot's confirmed position stays) while
// the server writes WAL past max_slot_wal_keep_size and checkpoints, which
// invalidates the slot under the running relay. The relay stops with an
// error naming the slot and docs/wal.md; its status and the observer show
// wal_status lost; nothing of the stalled window is published or confirmed;
// a relay started afterwards, with the broker back, refuses too and does not
// create a new slot (which would silently skip the window).
func TestWALSlotLostWhileStreaming(t *testing.T) {
	b, _ := walSetup(t, lostConf)
	ch := b.subscribe(t)
	flaky := &flakyPublisher{Publisher: b.publisher(t)}
	rec := &walStatusRecorder{}
	cfg := b.walConfig(t, flaky, nil)
	cfg.walObs = rec
	r, err := newEngine(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	done := make(chan error, 1)
	go func() { done <- r.run(runCtx) }()
	waitReading(t, r)

	b.emit(t, msgs(5, "k", "a")...)
	readAll(t, ch, 5, 20*time.Second)

	// The stall: the broker acknowledges nothing from here on.
	flaky.failing.Store(true)
	calls := flaky.calls.Load()
	commitB := b.emitAt(t, msgs(5, "k", "b")...)
	require.Eventually(t, func() bool { return flaky.calls.Load() > calls+1 }, 20*time.Second, 10*time.Millisecond)
	status, _ := b.slotRowOf(t, ctx, DefaultWALSlot)
	require.NotEqual(t, "lost", status)

	b.loseSlot(t, ctx)
	status, confirmed := b.slotRowOf(t, ctx, DefaultWALSlot)
	require.Equal(t, "lost", status)

	select {
	case err := <-done:
		require.ErrorIs(t, err, errSlotLost)
		require.Contains(t, err.Error(), fmt.Sprintf("slot %q", DefaultWALSlot))
		require.Contains(t, err.Error(), "docs/wal.md")
	case <-time.After(time.Minute):
		t.Fatal("the relay kept running on a lost slot")
	}
	st, ok := r.WALStatus()
	require.True(t, ok)
	require.Equal(t, "lost", st.WALStatus)
	require.Equal(t, "lost", rec.last().WALStatus, "the metrics did not see the slot lost")

	// A confirmed position at or past the commit record would make the next
	// reader skip the stalled transaction.
	require.LessOrEqual(t, confirmed, commitB, "the slot confirmed a transaction the broker never acknowledged")
	_, after := b.slotRowOf(t, ctx, DefaultWALSlot)
	require.Equal(t, confirmed, after, "confirmed after the loss")

	// The broker is back: a relay started now refuses as well, publishes
	// nothing and leaves the lost slot in place for the recovery.
	r2, err := newEngine(b.walConfig(t, b.publisher(t), nil))
	require.NoError(t, err)
	err = r2.run(ctx)
	require.ErrorIs(t, err, errSlotLost)
	select {
	case m := <-ch:
		t.Fatalf("published after the slot was lost: %s (%s)", m.eventID, m.data)
	case <-time.After(time.Second):
	}
	status, _ = b.slotRowOf(t, ctx, DefaultWALSlot)
	require.Equal(t, "lost", status, "the lost slot was replaced")
	var n int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots`).Scan(&n))
	require.Equal(t, 1, n)
}

// TestWALLostSlotRecoveryFromArchive: the recovery of docs/wal.md, on a
// cluster that archives its WAL. The slot is lost while events of a stalled
// window wait for the broker and producers go on emitting after the loss;
// the relay stops. Then, as the page says: note the lost slot's
// confirmed_flush_lsn, drop the slot, start a relay (it creates a new slot
// and names the gap, streaming nothing), archive the current segment, run
// deploy/wal-rescan.sh over the archive from the old confirmed position to
// the new slot's (its SQL re-emits the window's committed events with their
// ids) and accept the gap: the new relay publishes them. Every committed event is in the stream once; the rolled-back one is
// not.
func TestWALLostSlotRecoveryFromArchive(t *testing.T) {
	archive, err := os.MkdirTemp("", "pgrelay-archive-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(archive) })
	require.NoError(t, os.Chmod(archive, 0o777)) // the server may run as another user
	b, _ := walSetup(t, lostConf+"\narchive_mode = on\narchive_command = 'cp %p "+archive+"/%f'")
	ch := b.subscribe(t)
	flaky := &flakyPublisher{Publisher: b.publisher(t)}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r, err := newEngine(b.walConfig(t, flaky, nil))
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- r.run(ctx) }()
	waitReading(t, r)
	b.emit(t, msgs(5, "k", "a")...)
	readAll(t, ch, 5, 20*time.Second)

	flaky.failing.Store(true)
	calls := flaky.calls.Load()
	b.emit(t, msgs(5, "k", "b")...)
	o, err := pgrelay.NewOutbox(pgrelay.OutboxConfig{})
	require.NoError(t, err)
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, o.Emit(ctx, tx, pgrelay.Message{EventID: "rolled-back", Topic: "orders", Key: "k", Payload: []byte("x")}))
	require.NoError(t, tx.Rollback(ctx))
	require.Eventually(t, func() bool { return flaky.calls.Load() > calls+1 }, 20*time.Second, 10*time.Millisecond)
	b.loseSlot(t, ctx)
	select {
	case err := <-done:
		require.ErrorIs(t, err, errSlotLost)
	case <-time.After(time.Minute):
		t.Fatal("the relay kept running on a lost slot")
	}
	// The producers did not stop: these are in no slot.
	b.emit(t, msgs(3, "k2", "c")...)

	// The recovery.
	var from string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, DefaultWALSlot).Scan(&from))
	// The stopped relay's wal sender may take a moment to exit (55006).
	require.Eventually(t, func() bool {
		_, err := b.pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, DefaultWALSlot)
		return err == nil
	}, 20*time.Second, 100*time.Millisecond)
	// The new relay creates a new slot and names the gap; it streams
	// nothing until the gap is accepted.
	r2, _ := start(t, b.walConfig(t, b.publisher(t), nil))
	gap := waitGap(t, r2)
	var to, segment string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT confirmed_flush_lsn::text, pg_walfile_name(confirmed_flush_lsn) FROM pg_replication_slots WHERE slot_name = $1`,
		DefaultWALSlot).Scan(&to, &segment))
	require.Contains(t, gap, "and before "+to+" (the new slot's start)")
	require.Contains(t, gap, "the slot is missing on this server")
	_, err = b.pool.Exec(ctx, `SELECT pg_switch_wal()`)
	require.NoError(t, err)
	require.Eventually(t, func() bool { _, err := os.Stat(filepath.Join(archive, segment)); return err == nil }, 30*time.Second, 50*time.Millisecond,
		"segment %s not archived", segment)

	script, err := filepath.Abs("../deploy/wal-rescan.sh")
	require.NoError(t, err)
	cmd := exec.CommandContext(ctx, "sh", script, archive, from, to)
	cmd.Env = append(os.Environ(), "PG_WALDUMP="+filepath.Join(testcluster.BinDir(), "pg_waldump"))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	sql, err := cmd.Output()
	require.NoError(t, err, stderr.String())
	t.Logf("wal-rescan.sh %s %s:\n%s", from, to, sql)
	// The window may start before the a-events (a status update confirming
	// them may not have been sent): re-emitting them is harmless, the
	// broker's duplicate window drops them. The rolled-back event is not in.
	require.Contains(t, string(sql), "committed transaction(s) re-emitted")
	require.NotContains(t, string(sql), hex.EncodeToString([]byte(`"id":"rolled-back"`)))
	require.Contains(t, string(sql), hex.EncodeToString([]byte(`"id":"c-2"`)))
	_, err = b.pool.Exec(ctx, string(sql))
	require.NoError(t, err)
	svc, err := admin.New(admin.Config{Pool: b.pool})
	require.NoError(t, err)
	_, err = svc.AcceptWALGap(ctx, admin.WALGapRequest{Slot: DefaultWALSlot, Actor: "test", Reason: "window re-emitted from the archive"})
	require.NoError(t, err)

	// Each key's events in commit order (keys are published concurrently).
	got := readAll(t, ch, 8, 30*time.Second)
	byKey := map[string][]string{}
	for _, m := range got {
		byKey[m.key] = append(byKey[m.key], m.eventID)
	}
	require.Equal(t, map[string][]string{"k": {"b-0", "b-1", "b-2", "b-3", "b-4"}, "k2": {"c-0", "c-1", "c-2"}}, byKey)
}
