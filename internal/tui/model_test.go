package tui

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/lipgloss"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/admin"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

const actor = "tui:tester@host"

type bundle struct {
	pool *pgxpool.Pool
	svc  *admin.Service
	cfg  Config
}

func setup(t *testing.T) *bundle {
	t.Helper()
	pool := testdb.New(t)
	svc, err := admin.New(admin.Config{Pool: pool, QueryTimeout: 10 * time.Second})
	require.NoError(t, err)
	cleaner, err := pgrelay.NewInboxCleaner(pool, pgrelay.InboxRetentionConfig{Window: 2 * time.Hour, DuplicatesMax: 100}, nil)
	require.NoError(t, err)
	return &bundle{pool: pool, svc: svc, cfg: Config{Service: "consumer", Databases: []Database{{Admin: svc, Retention: cleaner.RunOnce}}, Actor: actor,
		DedupWindow: 2 * time.Hour, DedupRecordMax: 100, ExportDir: t.TempDir(),
		Settings: []Setting{{"dedup window", "2h00m"}}}}
}

func newModel(t *testing.T, cfg Config, w, h int) Model {
	t.Helper()
	m, err := New(cfg)
	require.NoError(t, err)
	return update(t, m, tea.WindowSizeMsg{Width: w, Height: h})
}

func update(t *testing.T, m Model, msg tea.Msg) Model {
	t.Helper()
	next, _ := m.Update(msg)
	return next.(Model)
}

// press sends a key and runs the command it returns (and the refresh that an
// operation's outcome triggers), feeding every message back.
func press(t *testing.T, m Model, key string) Model {
	t.Helper()
	var msg tea.KeyMsg
	switch key {
	case "enter":
		msg = tea.KeyMsg{Type: tea.KeyEnter}
	case "esc":
		msg = tea.KeyMsg{Type: tea.KeyEsc}
	case "tab":
		msg = tea.KeyMsg{Type: tea.KeyTab}
	case "down":
		msg = tea.KeyMsg{Type: tea.KeyDown}
	case "ctrl+r":
		msg = tea.KeyMsg{Type: tea.KeyCtrlR}
	default:
		msg = tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune(key)}
	}
	next, cmd := m.Update(msg)
	return drain(t, next.(Model), cmd)
}

// drain runs cmd (not ticks or blinks) and its follow-ups.
func drain(t *testing.T, m Model, cmd tea.Cmd) Model {
	t.Helper()
	for i := 0; cmd != nil && i < 5; i++ {
		msg := cmd()
		switch msg.(type) {
		case snapshotMsg, doneMsg, detailMsg:
		default:
			return m
		}
		next, c := m.Update(msg)
		m, cmd = next.(Model), c
	}
	return m
}

// twoDatabases is a console over two databases, orders and billing, each
// with its own pool and Service, as relay tui opens them.
func twoDatabases(t *testing.T) (cfg Config, orders, billing *pgxpool.Pool) {
	t.Helper()
	a, b := setup(t), setup(t)
	a.cfg.Databases[0].Name = "orders"
	b.cfg.Databases[0].Name = "billing"
	cfg = a.cfg
	cfg.Service = "relay"
	cfg.Databases = append(cfg.Databases, b.cfg.Databases[0])
	return cfg, a.pool, b.pool
}

func refresh(t *testing.T, m Model) Model {
	t.Helper()
	return drain(t, m, m.fetch())
}

// checkScreen asserts the view fills the terminal exactly.
func checkScreen(t *testing.T, m Model, w, h int) string {
	t.Helper()
	v := m.View()
	lines := strings.Split(v, "\n")
	require.Len(t, lines, h, v)
	for _, l := range lines {
		require.LessOrEqual(t, lipgloss.Width(l), w, l)
	}
	return v
}

func fixedSnapshot() *Snapshot {
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	orig := now.Add(-90 * time.Second)
	finished := now.Add(-30 * time.Minute)
	hourly := make([]admin.DedupHour, 24)
	for i := range hourly {
		hourly[i] = admin.DedupHour{Hour: now.Add(time.Duration(i-23) * time.Hour), Received: 10, Duplicates: int64(i % 4)}
	}
	return &Snapshot{
		At: now,
		Stats: &admin.Stats{
			Inbox:  admin.InboxStats{ByStatus: map[string]int64{"pending": 2, "processing": 0, "processed": 7, "dead": 1}},
			Outbox: admin.OutboxStats{ByStatus: map[string]int64{"pending": 3, "published": 0, "dead": 0}},
		},
		Dedup: &admin.DedupReport{Received: 240, Duplicates: 60, HitRate: 0.25, Hourly: hourly, RecordRows: 60, RecordBytes: 8192,
			Recent: []admin.Duplicate{{EventID: "evt-dup-1", Handler: "ledger", SeenAt: now.Add(-5 * time.Second),
				OriginalReceivedAt: &orig, OriginalAgeSeconds: 85}}},
		Keys: []admin.InboxKey{
			{EventID: "evt-dead-1", Status: "dead", Attempts: 5, ReceivedAt: now},
			{EventID: "evt-done-1", Status: "processed", Attempts: 1, ReceivedAt: now, FinishedAt: &finished},
		},
		Outbox: &admin.OutboxOverview{
			Partitions: []admin.Partition{{Partition: 0, Owner: "relay-a", Epoch: 4, Held: true, Pending: 3, LagSeconds: 12}, {Partition: 1}},
			Relays:     []admin.RelayNode{{NodeID: "relay-a", Alive: true, Partitions: 1, LastSeen: now}},
		},
		Stream: &StreamInfo{Name: "PGRELAY", MaxAge: 14 * 24 * time.Hour, Duplicates: 2 * time.Minute},
	}
}

// TestNarrowTabs: at 80x24 the console shows one tab at a time, switched with
// 1-4, Tab and the panel letters, and every screen fills the terminal.
func TestNarrowTabs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m := newModel(t, b.cfg, 80, 24)
	m = update(t, m, snapshotMsg{snap: fixedSnapshot()})

	v := checkScreen(t, m, 80, 24)
	require.Contains(t, v, "[1 Stats]")
	require.Contains(t, v, "25.0%")
	require.Contains(t, v, "60 duplicates blocked of 240 received")
	require.Contains(t, v, "evt-dup-1")
	require.Contains(t, v, "ledger")
	require.Contains(t, v, "1m25s old")
	require.Contains(t, v, "record 60 rows · 8.0 KiB · cap 100")
	require.Contains(t, v, "inbox table 10 rows")

	m = press(t, m, "2")
	v = checkScreen(t, m, 80, 24)
	require.Contains(t, v, "[2 Keys]")
	require.Contains(t, v, "> evt-dead-1")
	require.Contains(t, v, "kept (dead)")
	require.Contains(t, v, "1h30m", "processed 30 minutes ago with a 2h window")

	m = press(t, m, "o")
	v = checkScreen(t, m, 80, 24)
	require.Contains(t, v, "[3 Outbox]")
	require.Contains(t, v, "relays alive 1 of 1")
	require.Contains(t, v, "relay-a")

	m = press(t, m, "tab")
	v = checkScreen(t, m, 80, 24)
	require.Contains(t, v, "[4 Config]")
	require.Contains(t, v, "dedup window 2h00m shorter than the stream's MaxAge 14d00h")
	require.Contains(t, v, "duplicate rate 25.0%")

	m = press(t, m, "tab")
	require.Contains(t, checkScreen(t, m, 80, 24), "[1 Stats]")
}

// TestWideLayout: at 200x60 the three panels and the outbox are on one
// screen.
func TestWideLayout(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m := newModel(t, b.cfg, 200, 60)
	m = update(t, m, snapshotMsg{snap: fixedSnapshot()})
	v := checkScreen(t, m, 200, 60)
	for _, want := range []string{"┌ Dedup ", "┌ Keys ", "┌ Config & tuning ", "┌ Outbox ", "25.0%", "evt-dead-1", "relay-a", "Advice"} {
		require.Contains(t, v, want)
	}
	// The dedup, keys and config panels share their rows.
	var row string
	for _, l := range strings.Split(v, "\n") {
		if strings.Contains(l, "┌ Dedup") {
			row = l
		}
	}
	require.Contains(t, row, "┌ Keys")
	require.Contains(t, row, "┌ Config & tuning")
}

// TestHelpOverlay: h shows every key; any key closes it.
func TestHelpOverlay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m := newModel(t, b.cfg, 80, 24)
	m = press(t, m, "h")
	v := checkScreen(t, m, 80, 24)
	for _, want := range []string{"Ctrl+R", "purge the selected dead key", "export statistics", "run inbox retention"} {
		require.Contains(t, v, want)
	}
	m = press(t, m, "x")
	require.NotContains(t, checkScreen(t, m, 80, 24), "Ctrl+R      reset")
}

func storeDead(t *testing.T, pool *pgxpool.Pool, id string) {
	t.Helper()
	_, err := pgrelay.Receive(context.Background(), pool, []pgrelay.Incoming{{
		Message: pgrelay.Message{EventID: id, Topic: "orders", EventType: "OrderPaid"}, DeadReason: "malformed"}})
	require.NoError(t, err)
}

func auditRows(t *testing.T, pool *pgxpool.Pool, action string) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT event_id || ' ' || actor FROM pgrelay.replay_audit WHERE action = $1 ORDER BY id`, action)
	require.NoError(t, err)
	var out []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return out
}

// TestPurgeAsksFirstAndAudits: d on a dead key asks; any key but y cancels
// and changes nothing; y purges through the admin operation, which writes the
// audit row. A key that is not dead is refused without asking.
func TestPurgeAsksFirstAndAudits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := pgrelay.Receive(context.Background(), b.pool, []pgrelay.Incoming{{Message: pgrelay.Message{EventID: "evt-live-1"}}})
	require.NoError(t, err)
	storeDead(t, b.pool, "evt-dead-1") // the newest: listed first
	m := refresh(t, newModel(t, b.cfg, 80, 24))
	m = press(t, m, "k")
	require.Contains(t, checkScreen(t, m, 80, 24), "> evt-dead-1")

	m = press(t, m, "d")
	v := checkScreen(t, m, 80, 24)
	require.Contains(t, v, "Purge dead event evt-dead-1?")
	require.Contains(t, v, actor)
	m = press(t, m, "n")
	require.Contains(t, checkScreen(t, m, 80, 24), "cancelled")
	require.Empty(t, auditRows(t, b.pool, "purge"))
	require.Contains(t, checkScreen(t, m, 80, 24), "evt-dead-1")

	m = press(t, m, "d")
	m = press(t, m, "y")
	v = checkScreen(t, m, 80, 24)
	require.Contains(t, v, "purged evt-dead-1 (audit #")
	require.NotContains(t, v, "> evt-dead-1", "the refresh after the purge no longer lists it")
	require.Equal(t, []string{"evt-dead-1 " + actor}, auditRows(t, b.pool, "purge"))

	// The remaining key is pending: refused, no confirmation.
	require.Contains(t, checkScreen(t, m, 80, 24), "> evt-live-1")
	m = press(t, m, "d")
	v = checkScreen(t, m, 80, 24)
	require.Contains(t, v, "evt-live-1 is pending: only dead events can be purged")
	require.NotContains(t, v, "Confirm")
}

// TestDetailsAndSearch: / filters the keys by a part of the event id; Enter
// shows the selected event, from which d purges it.
func TestDetailsAndSearch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	storeDead(t, b.pool, "alpha-1")
	storeDead(t, b.pool, "beta-2")
	m := refresh(t, newModel(t, b.cfg, 80, 24))
	m = press(t, m, "/")
	for _, r := range "beta" {
		m = press(t, m, string(r))
	}
	require.Contains(t, checkScreen(t, m, 80, 24), "/beta")
	m = press(t, m, "enter")
	v := checkScreen(t, m, 80, 24)
	require.Contains(t, v, "1 keys · search /beta")
	require.NotContains(t, v, "alpha-1")

	m = press(t, m, "enter")
	v = checkScreen(t, m, 80, 24)
	require.Contains(t, v, "Event beta-2")
	require.Contains(t, v, "malformed")
	m = press(t, m, "d")
	require.Contains(t, checkScreen(t, m, 80, 24), "Purge dead event beta-2?")
	m = press(t, m, "y")
	require.Equal(t, []string{"beta-2 " + actor}, auditRows(t, b.pool, "purge"))

	m = press(t, m, "esc")
	require.Contains(t, checkScreen(t, m, 80, 24), "alpha-1")
}

// TestResetCountersAsksFirstAndAudits: Ctrl+R asks; y empties the record and
// writes the audit row.
func TestResetCountersAsksFirstAndAudits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	for range 2 {
		_, err := pgrelay.Receive(ctx, b.pool, []pgrelay.Incoming{{Message: pgrelay.Message{EventID: "e1"}}})
		require.NoError(t, err)
	}
	m := refresh(t, newModel(t, b.cfg, 80, 24))
	require.Contains(t, checkScreen(t, m, 80, 24), "1 duplicates blocked of 2 received")
	m = press(t, m, "ctrl+r")
	require.Contains(t, checkScreen(t, m, 80, 24), "Reset the dedup counters?")
	m = press(t, m, "q") // a no: the confirmation takes the key, the console stays
	require.Empty(t, auditRows(t, b.pool, "reset_dedup_stats"))
	m = press(t, m, "ctrl+r")
	m = press(t, m, "y")
	v := checkScreen(t, m, 80, 24)
	require.Contains(t, v, "dedup counters reset (audit #")
	require.Contains(t, v, "0 duplicates blocked of 0 received")
	require.Equal(t, []string{"* " + actor}, auditRows(t, b.pool, "reset_dedup_stats"))
}

// TestRetentionAndExport: f asks, then runs retention; s writes the snapshot
// as JSON.
func TestRetentionAndExport(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.pool.Exec(context.Background(), `INSERT INTO pgrelay.inbox (event_id, status, finished_at) VALUES ('old', 'processed', now() - interval '3 hours'), ('new', 'processed', now())`)
	require.NoError(t, err)
	m := refresh(t, newModel(t, b.cfg, 80, 24))
	m = press(t, m, "f")
	require.Contains(t, checkScreen(t, m, 80, 24), "Run inbox retention now?")
	m = press(t, m, "y")
	require.Contains(t, checkScreen(t, m, 80, 24), "retention deleted 1 processed event(s)")

	m = press(t, m, "s")
	v := checkScreen(t, m, 80, 24)
	require.Contains(t, v, "statistics exported to ")
	files, err := filepath.Glob(filepath.Join(b.cfg.ExportDir, "pgrelay-stats-*.json"))
	require.NoError(t, err)
	require.Len(t, files, 1)
	raw, err := os.ReadFile(files[0])
	require.NoError(t, err)
	var snap Snapshot
	require.NoError(t, json.Unmarshal(raw, &snap))
	require.NotNil(t, snap.Dedup)
	require.Len(t, snap.Keys, 1)
	require.Equal(t, "new", snap.Keys[0].EventID)
}

// TestAdvise covers the advice rules.
func TestAdvise(t *testing.T) {
	t.Parallel()
	week := 7 * 24 * time.Hour
	snap := &Snapshot{}
	require.Contains(t, Advise(snap, week, 10)[0], "stream settings unknown")
	snap.Stream = &StreamInfo{Name: "S", MaxAge: 0}
	require.Contains(t, Advise(snap, week, 10)[0], "keeps messages forever")
	snap.Stream.MaxAge = 24 * time.Hour
	require.Equal(t, []string{"nothing to tune: the settings look consistent"}, Advise(snap, week, 10))
	snap.Dedup = &admin.DedupReport{RecordRows: 10}
	require.Contains(t, Advise(snap, week, 10)[0], "at its cap (10)")
	snap.Dedup = nil
	snap.Stats = &admin.Stats{Inbox: admin.InboxStats{ByStatus: map[string]int64{}, OldestClaimableSeconds: 120},
		Outbox: admin.OutboxStats{ByStatus: map[string]int64{"pending": 5}}}
	snap.Outbox = &admin.OutboxOverview{}
	advice := strings.Join(Advise(snap, week, 10), "\n")
	require.Contains(t, advice, "consumer lag 2m00s")
	require.Contains(t, advice, "outbox has 5 pending row(s) and no relay is alive")
}

// TestKeyHintsAt60x20: on a 60x20 terminal the bottom line shows the key
// hints, also while a refresh runs and after it (the "refreshing" status
// used to stay there alone), and every screen fills the terminal.
func TestKeyHintsAt60x20(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m := newModel(t, b.cfg, 60, 20)
	m = update(t, m, snapshotMsg{snap: fixedSnapshot()})
	bottom := func(m Model) string {
		lines := strings.Split(checkScreen(t, m, 60, 20), "\n")
		return lines[len(lines)-1]
	}
	hints := func(line string) {
		t.Helper()
		for _, want := range []string{"1-4", "/ search", "h help"} {
			require.Contains(t, line, want, "bottom line %q", line)
		}
	}
	hints(bottom(m))

	next, cmd := m.Update(tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune("r")})
	m = next.(Model)
	line := bottom(m)
	require.Contains(t, line, "refreshing")
	hints(line)
	m = drain(t, m, cmd)
	line = bottom(m)
	require.NotContains(t, line, "refreshing", "the refresh is over")
	hints(line)
	for _, key := range []string{"2", "3", "4"} {
		m = press(t, m, key)
		hints(bottom(m))
	}
}

// TestSeveralDatabases: with two databases the console shows a row of each
// (outbox lag, pending and dead; inbox lag, pending and dead) and the
// selected one's name in the header; n and p switch the database the panels
// show, and an operation's confirmation and outcome name the database it acts
// on, which is the only one it changes.
func TestSeveralDatabases(t *testing.T) {
	t.Parallel()
	cfg, orders, billing := twoDatabases(t)
	ctx := context.Background()
	storeDead(t, orders, "evt-orders-dead")
	storeDead(t, billing, "evt-billing-dead")
	_, err := billing.Exec(ctx, `INSERT INTO pgrelay.outbox (topic, key, payload) VALUES ('invoices', 'k', 'x'), ('invoices', 'k', 'y')`)
	require.NoError(t, err)

	for _, size := range [][2]int{{80, 24}, {200, 60}} {
		w, h := size[0], size[1]
		m := refresh(t, newModel(t, cfg, w, h))
		v := checkScreen(t, m, w, h)
		require.Contains(t, v, "Databases")
		rows := map[string]string{}
		for _, l := range strings.Split(v, "\n") {
			for _, name := range []string{"orders", "billing"} {
				if i := strings.Index(l, name+" "); i >= 0 && strings.Contains(l, "│") && !strings.Contains(l, "console") && rows[name] == "" {
					rows[name] = strings.Fields(l[i:])[0] + " " + strings.Join(strings.Fields(strings.Trim(l[i+len(name):], "│ ")), " ")
				}
			}
		}
		require.Equal(t, "orders 0s 0 0 0s 0 1", rows["orders"], v)
		require.Regexp(t, `^billing \d+s 2 0 0s 0 1$`, rows["billing"], v)
		require.Contains(t, strings.Split(v, "\n")[0], "orders", "the header names the selected database")
		require.Contains(t, v, "> orders")
	}

	m := refresh(t, newModel(t, cfg, 80, 24))
	m = press(t, m, "k")
	v := checkScreen(t, m, 80, 24)
	require.Contains(t, v, "> evt-orders-dead")
	require.NotContains(t, v, "evt-billing-dead")

	m = press(t, m, "n")
	v = checkScreen(t, m, 80, 24)
	require.Contains(t, strings.Split(v, "\n")[0], "billing")
	require.Contains(t, v, "> billing")
	require.Contains(t, v, "> evt-billing-dead")
	require.NotContains(t, v, "evt-orders-dead")

	m = press(t, m, "d")
	v = checkScreen(t, m, 80, 24)
	require.Contains(t, v, "Purge dead event evt-billing-dead in database billing?")
	m = press(t, m, "y")
	require.Contains(t, checkScreen(t, m, 80, 24), "purged evt-billing-dead in database billing (audit #")
	require.Equal(t, []string{"evt-billing-dead " + actor}, auditRows(t, billing, "purge"))
	require.Empty(t, auditRows(t, orders, "purge"))

	m = press(t, m, "ctrl+r")
	require.Contains(t, checkScreen(t, m, 80, 24), "Reset the dedup counters in database billing?")
	m = press(t, m, "n")
	m = press(t, m, "f")
	require.Contains(t, checkScreen(t, m, 80, 24), "Run inbox retention now in database billing?")
	m = press(t, m, "n")

	m = press(t, m, "p") // back to orders, wrapping around
	v = checkScreen(t, m, 80, 24)
	require.Contains(t, strings.Split(v, "\n")[0], "orders")
	require.Contains(t, v, "> evt-orders-dead")

	// A snapshot loaded before a switch updates the rows only.
	stale := fixedSnapshot()
	stale.Keys = []admin.InboxKey{{EventID: "evt-stale", Status: "dead"}}
	m = update(t, m, snapshotMsg{snap: stale, db: 1})
	require.NotContains(t, checkScreen(t, m, 80, 24), "evt-stale")
}

// TestOneDatabaseHasNoDatabasesPanel: one database shows no databases panel
// and n reports there is nothing to switch to.
func TestOneDatabaseHasNoDatabasesPanel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m := refresh(t, newModel(t, b.cfg, 80, 24))
	require.NotContains(t, checkScreen(t, m, 80, 24), "Databases")
	m = press(t, m, "n")
	require.Contains(t, checkScreen(t, m, 80, 24), "one database: nothing to switch to")
}
