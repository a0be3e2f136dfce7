package tui

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/charmbracelet/bubbles/textinput"
	tea "github.com/charmbracelet/bubbletea"

	"github.com/pgrelay/pgrelay/internal/admin"
)

// The panels (wide layout) and tabs (narrow layout). In the narrow layout
// the dedup panel is the Stats tab.
const (
	panelDedup = iota
	panelKeys
	panelOutbox
	panelConfig
	panelCount
)

var panelNames = [panelCount]string{"Stats", "Keys", "Outbox", "Config"}

// Wide is the smallest terminal that gets the wide layout.
const (
	WideWidth  = 120
	WideHeight = 30
)

// Messages.
type (
	// snapshotMsg is a snapshot of database db (an index of
	// Config.Databases).
	snapshotMsg struct {
		snap *Snapshot
		db   int
	}
	tickMsg struct{}
	// doneMsg reports an operation's outcome on the status line.
	doneMsg struct {
		status string
		err    error
	}
	detailMsg struct {
		event *admin.DeadLetter
		err   error
	}
)

type confirmation struct {
	prompt string
	run    tea.Cmd
}

// Model is the console's bubbletea model.
type Model struct {
	cfg           Config
	width, height int
	focus         int
	// db is the selected database (an index of cfg.Databases): the panels
	// show it and the operations act on it.
	db int
	// snap is the selected database's latest snapshot; nil until one
	// arrives.
	snap *Snapshot
	// rows are the databases panel's rows (several databases), from the
	// latest snapshot of any of them.
	rows      []DatabaseRow
	loading   bool
	cursor    int
	search    textinput.Model
	searching bool
	query     string
	detail    *admin.DeadLetter
	confirm   *confirmation
	help      bool
	status    string
	statusErr bool
}

// New returns the console's model.
func New(cfg Config) (Model, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return Model{}, err
	}
	ti := textinput.New()
	ti.Prompt = "/"
	ti.Placeholder = "part of an event id"
	ti.CharLimit = 255
	return Model{cfg: cfg, width: 80, height: 24, search: ti}, nil
}

// Init loads the first snapshot and starts the refresh ticks.
func (m Model) Init() tea.Cmd {
	return tea.Batch(m.fetch(), m.tick())
}

func (m Model) tick() tea.Cmd {
	return tea.Tick(m.cfg.Refresh, func(time.Time) tea.Msg { return tickMsg{} })
}

func (m Model) fetch() tea.Cmd {
	cfg, db, query := m.cfg, m.db, m.query
	return func() tea.Msg {
		ctx, cancel := context.WithTimeout(context.Background(), cfg.Timeout)
		defer cancel()
		return snapshotMsg{snap: load(ctx, cfg, db, query), db: db}
	}
}

// database is the selected database.
func (m Model) database() Database { return m.cfg.Databases[m.db] }

// several reports whether the console shows several databases.
func (m Model) several() bool { return len(m.cfg.Databases) > 1 }

// in is " in database NAME" with several databases, for the prompts and
// the status line of an operation on the selected one; else "".
func (m Model) in() string {
	if !m.several() {
		return ""
	}
	return " in database " + m.database().Name
}

// selectDatabase selects database i and loads it.
func (m Model) selectDatabase(i int) (tea.Model, tea.Cmd) {
	if !m.several() {
		m.setStatus("one database: nothing to switch to", true)
		return m, nil
	}
	n := len(m.cfg.Databases)
	m.db = (i%n + n) % n
	m.snap, m.detail, m.cursor = nil, nil, 0
	m.loading = true
	m.setStatus("database "+m.database().Name, false)
	return m, m.fetch()
}

// operation runs f with a timeout as a command reporting on the status line.
func (m Model) operation(f func(ctx context.Context) (string, error)) tea.Cmd {
	timeout := m.cfg.Timeout
	return func() tea.Msg {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		s, err := f(ctx)
		return doneMsg{status: s, err: err}
	}
}

func (m Model) wide() bool { return m.width >= WideWidth && m.height >= WideHeight }

// selected returns the inbox key under the cursor.
func (m Model) selected() (admin.InboxKey, bool) {
	if m.snap == nil || m.cursor < 0 || m.cursor >= len(m.snap.Keys) {
		return admin.InboxKey{}, false
	}
	return m.snap.Keys[m.cursor], true
}

func (m *Model) setStatus(s string, isErr bool) { m.status, m.statusErr = s, isErr }

// statusRefreshing is the status while a refresh asked for with r runs; the
// snapshot's arrival clears it.
const statusRefreshing = "refreshing"

// Update handles a message.
func (m Model) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case tea.WindowSizeMsg:
		m.width, m.height = msg.Width, msg.Height
		return m, nil
	case snapshotMsg:
		if msg.snap != nil && len(msg.snap.Databases) > 0 {
			m.rows = msg.snap.Databases
		}
		if msg.db != m.db {
			return m, nil // loaded before a switch: the new one's is on its way
		}
		m.loading = false
		if m.status == statusRefreshing {
			m.setStatus("", false) // done: the header shows when
		}
		m.snap = msg.snap
		if m.snap != nil && m.cursor >= len(m.snap.Keys) {
			m.cursor = max(0, len(m.snap.Keys)-1)
		}
		return m, nil
	case tickMsg:
		if m.loading {
			return m, m.tick()
		}
		m.loading = true
		return m, tea.Batch(m.fetch(), m.tick())
	case doneMsg:
		if msg.err != nil {
			m.setStatus(msg.status+": "+msg.err.Error(), true)
		} else {
			m.setStatus(msg.status, false)
		}
		m.loading = true
		return m, m.fetch()
	case detailMsg:
		if msg.err != nil {
			m.setStatus("details: "+msg.err.Error(), true)
			return m, nil
		}
		m.detail = msg.event
		return m, nil
	case tea.KeyMsg:
		return m.key(msg)
	}
	return m, nil
}

func (m Model) key(msg tea.KeyMsg) (tea.Model, tea.Cmd) {
	k := msg.String()
	if k == "ctrl+c" {
		return m, tea.Quit
	}
	// A confirmation takes every key: y runs, anything else cancels.
	if m.confirm != nil {
		c := m.confirm
		m.confirm = nil
		if k == "y" || k == "Y" {
			m.setStatus("running…", false)
			return m, c.run
		}
		m.setStatus("cancelled", false)
		return m, nil
	}
	if m.searching {
		switch k {
		case "enter":
			m.searching = false
			m.query = m.search.Value()
			m.search.Blur()
			m.cursor = 0
			m.loading = true
			return m, m.fetch()
		case "esc":
			m.searching = false
			m.search.Blur()
			return m, nil
		}
		var cmd tea.Cmd
		m.search, cmd = m.search.Update(msg)
		return m, cmd
	}
	if m.help {
		m.help = false
		if k == "q" {
			return m, tea.Quit
		}
		return m, nil
	}
	if m.detail != nil {
		if k == "q" {
			return m, tea.Quit
		}
		if k == "d" {
			return m.askPurge()
		}
		m.detail = nil
		return m, nil
	}
	switch k {
	case "q":
		return m, tea.Quit
	case "h", "?":
		m.help = true
	case "tab":
		m.focus = (m.focus + 1) % panelCount
	case "shift+tab":
		m.focus = (m.focus + panelCount - 1) % panelCount
	case "1", "2", "3", "4":
		m.focus = int(k[0] - '1')
	case "n":
		return m.selectDatabase(m.db + 1)
	case "p":
		return m.selectDatabase(m.db - 1)
	case "k":
		m.focus = panelKeys
	case "o":
		m.focus = panelOutbox
	case "c":
		m.focus = panelConfig
	case "r":
		m.loading = true
		m.setStatus(statusRefreshing, false)
		return m, m.fetch()
	case "up":
		if m.cursor > 0 {
			m.cursor--
		}
	case "down":
		if m.snap != nil && m.cursor < len(m.snap.Keys)-1 {
			m.cursor++
		}
	case "/":
		m.focus = panelKeys
		m.searching = true
		m.search.SetValue(m.query)
		m.search.CursorEnd()
		return m, m.search.Focus()
	case "esc":
		if m.query != "" {
			m.query = ""
			m.cursor = 0
			m.loading = true
			return m, m.fetch()
		}
	case "enter":
		key, ok := m.selected()
		if !ok {
			m.setStatus("no key selected", true)
			return m, nil
		}
		svc, timeout := m.database().Admin, m.cfg.Timeout
		return m, func() tea.Msg {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			d, err := svc.Show(ctx, admin.SourceInbox, key.EventID, key.Handler)
			return detailMsg{event: d, err: err}
		}
	case "d":
		return m.askPurge()
	case "s":
		path, err := export(m.cfg.ExportDir, m.snap)
		if err != nil {
			m.setStatus("export: "+err.Error(), true)
		} else {
			m.setStatus("statistics exported to "+path, false)
		}
	case "f":
		run, in := m.database().Retention, m.in()
		if run == nil {
			m.setStatus("retention is not available here", true)
			return m, nil
		}
		m.confirm = &confirmation{
			prompt: fmt.Sprintf("Run inbox retention now%s? It deletes processed events older than the dedup window (%s) and prunes the duplicate record.", in, fmtDur(m.cfg.DedupWindow)),
			run: m.operation(func(ctx context.Context) (string, error) {
				n, err := run(ctx)
				if err != nil {
					return "retention" + in, err
				}
				return fmt.Sprintf("retention deleted %d processed event(s)%s", n, in), nil
			}),
		}
	case "ctrl+r":
		svc, actor, in := m.database().Admin, m.cfg.Actor, m.in()
		m.confirm = &confirmation{
			prompt: fmt.Sprintf("Reset the dedup counters%s? This empties the duplicate record and the 24 h counts; recorded in the audit table as %s.", in, actor),
			run: m.operation(func(ctx context.Context) (string, error) {
				id, err := svc.ResetDedupStats(ctx, actor, "reset from the operator console")
				if err != nil {
					return "reset" + in, err
				}
				return fmt.Sprintf("dedup counters reset%s (audit #%d)", in, id), nil
			}),
		}
	}
	return m, nil
}

// askPurge asks to purge the selected (or shown) key, which must be dead.
func (m Model) askPurge() (tea.Model, tea.Cmd) {
	var id, status, handler string
	if m.detail != nil {
		id, status, handler = m.detail.EventID, m.detail.Status, m.detail.Handler
	} else if key, ok := m.selected(); ok && (m.focus == panelKeys || !m.wide()) {
		id, status, handler = key.EventID, key.Status, key.Handler
	} else {
		m.setStatus("select a dead key in Keys first (k)", true)
		return m, nil
	}
	if status != "dead" {
		m.setStatus(fmt.Sprintf("%s is %s: only dead events can be purged", id, status), true)
		return m, nil
	}
	svc, actor, in := m.database().Admin, m.cfg.Actor, m.in()
	m.detail = nil
	m.confirm = &confirmation{
		prompt: fmt.Sprintf("Purge dead event %s%s? It is deleted and a redelivery would be received as new; recorded in the audit table as %s.", id, in, actor),
		run: m.operation(func(ctx context.Context) (string, error) {
			zero := time.Duration(0)
			res, err := svc.Purge(ctx, admin.SourceInbox, admin.PurgeRequest{
				Filter: admin.Filter{EventID: id, Handler: handler}, OlderThan: &zero, Actor: actor,
				Reason: "purged from the operator console"})
			if err != nil {
				return "purge " + id + in, err
			}
			if res.Count == 0 {
				return "purge " + id + in, errors.New("no longer dead: nothing purged")
			}
			return fmt.Sprintf("purged %s%s (audit #%d)", id, in, res.Events[0].AuditID), nil
		}),
	}
	return m, nil
}
