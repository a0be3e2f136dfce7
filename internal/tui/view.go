package tui

import (
	"cmp"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/charmbracelet/lipgloss"
	"github.com/charmbracelet/x/ansi"

	"github.com/pgrelay/pgrelay/internal/admin"
)

var (
	titleStyle   = lipgloss.NewStyle().Bold(true)
	focusStyle   = lipgloss.NewStyle().Foreground(lipgloss.Color("12"))
	plainStyle   = lipgloss.NewStyle().Foreground(lipgloss.Color("8"))
	errorStyle   = lipgloss.NewStyle().Foreground(lipgloss.Color("9"))
	warnStyle    = lipgloss.NewStyle().Foreground(lipgloss.Color("11"))
	overlayStyle = lipgloss.NewStyle().Border(lipgloss.DoubleBorder()).Padding(0, 1)
)

// View renders the screen.
func (m Model) View() string {
	w, h := max(m.width, 20), max(m.height, 8)
	var body string
	switch {
	case m.confirm != nil:
		body = m.overlay(w, h-2, "Confirm", wrap(m.confirm.prompt, min(w-6, 70))+"\n\n[y] yes    any other key: no")
	case m.help:
		body = m.overlay(w, h-2, "Keys", helpText)
	case m.detail != nil:
		body = m.overlay(w, h-2, "Event "+m.detail.EventID, m.detailText(min(w-6, 100)))
	default:
		bh := h - 2
		var top string
		if m.several() {
			lines := m.databaseLines(bh / 4)
			top = box("Databases (n/p switch)", lines, w, len(lines)+2, false) + "\n"
			bh -= len(lines) + 2
		}
		if m.wide() {
			body = top + m.wideBody(w, bh)
		} else {
			body = top + m.narrowBody(w, bh)
		}
	}
	return m.header(w) + "\n" + fit(body, w, h-2) + "\n" + m.footer(w)
}

// databaseLines are the databases panel's lines: a row per database with
// its outbox and inbox lag, pending and dead counts, the selected one marked,
// at most rows of them (scrolled to the selected one).
func (m Model) databaseLines(rows int) []string {
	nameW := 12
	for _, d := range m.cfg.Databases {
		nameW = max(nameW, min(lipgloss.Width(d.Name), 24))
	}
	lines := []string{fmt.Sprintf("  %-*s %10s %7s %5s  %9s %7s %5s", nameW, "DATABASE", "OUTBOX LAG", "PENDING", "DEAD", "INBOX LAG", "PENDING", "DEAD")}
	rows = max(rows-1, 1)
	start := 0
	if m.db >= rows {
		start = m.db - rows + 1
	}
	for i := start; i < len(m.cfg.Databases) && i < start+rows; i++ {
		name := m.cfg.Databases[i].Name
		mark := "  "
		if i == m.db {
			mark = "> "
		}
		line := mark + fmt.Sprintf("%-*s ", nameW, ansi.Truncate(name, nameW, "…"))
		var row *DatabaseRow
		for j := range m.rows {
			if m.rows[j].Name == name {
				row = &m.rows[j]
			}
		}
		switch {
		case row == nil:
			line += "loading…"
		case row.Stats == nil:
			line += errorStyle.Render("unreadable: " + row.Error)
		default:
			st := row.Stats
			line += fmt.Sprintf("%10s %7d %5d  %9s %7d %5d",
				fmtDur(secs(st.Outbox.OldestPendingSeconds)), st.Outbox.ByStatus["pending"], st.Outbox.ByStatus["dead"],
				fmtDur(secs(st.Inbox.OldestClaimableSeconds)), st.Inbox.ByStatus["pending"], st.Inbox.ByStatus["dead"])
		}
		if i == m.db {
			line = focusStyle.Render(line)
		}
		lines = append(lines, line)
	}
	return lines
}

const helpText = `Tab / 1-4   switch panel (Stats, Keys, Outbox, Config)
n / p       next / previous database (several served)
k o c       Keys, Outbox, Config
Up / Down   move in Keys
/           search keys (Enter applies, Esc clears)
Enter       details of the selected key
d           purge the selected dead key (asks first, audited)
r           refresh now
s           export statistics to a JSON file
f           run inbox retention now (asks first)
Ctrl+R      reset the dedup counters (asks first, audited)
h           this help
q           quit`

func (m Model) header(w int) string {
	left := titleStyle.Render("pgrelay " + m.cfg.Service + " console")
	db := ""
	if m.several() {
		db = focusStyle.Render(m.database().Name) + " "
		left += " · " + db
	}
	right := "h help · q quit"
	if m.snap != nil {
		right = "refreshed " + m.snap.At.Format("15:04:05") + " · " + right
	}
	if m.loading {
		right = "… " + right
	}
	if !m.wide() {
		tabs := make([]string, panelCount)
		for i, n := range panelNames {
			if i == m.focus {
				tabs[i] = focusStyle.Render(fmt.Sprintf("[%d %s]", i+1, n))
			} else {
				tabs[i] = fmt.Sprintf(" %d %s ", i+1, n)
			}
		}
		left = titleStyle.Render("pgrelay") + " " + db + strings.Join(tabs, "")
		right = "h help"
		if m.loading {
			right = "… " + right
		}
	}
	gap := w - lipgloss.Width(left) - lipgloss.Width(right)
	if gap < 1 {
		return ansi.Truncate(left, w, "")
	}
	return left + strings.Repeat(" ", gap) + right
}

// keyHints are the bottom line's key hints, longest first: the footer shows
// the longest that fits beside the status, so a narrow terminal (60
// columns) still shows how to move, search and get help.
var keyHints = []string{
	"Tab/1-4 panels · / search · Enter details · d purge · s export · h help",
	"Tab/1-4 panels · / search · Enter details · h help",
	"1-4 panels · / search · h help",
	"1-4 · / search · h help",
}

// hintFor returns the longest key hint of at most w columns, or "".
func hintFor(w int) string {
	for _, h := range keyHints {
		if lipgloss.Width(h) <= w {
			return h
		}
	}
	return ""
}

func (m Model) footer(w int) string {
	if m.searching {
		return ansi.Truncate(m.search.View(), w, "")
	}
	var msg string
	style := plainStyle
	switch {
	case m.status != "":
		msg, style = m.status, lipgloss.NewStyle()
		if m.statusErr {
			style = errorStyle
		}
	case m.snap != nil && len(m.snap.Errors) > 0:
		msg, style = "! "+m.snap.Errors[0], warnStyle
	}
	if msg == "" {
		return plainStyle.Render(ansi.Truncate(cmp.Or(hintFor(w), keyHints[len(keyHints)-1]), w, "…"))
	}
	// The message first, then the longest hint that still fits; a message
	// too long for both (an error, an export's path) keeps the line to
	// itself rather than be cut.
	const sep = " · "
	if hint := hintFor(w - lipgloss.Width(msg) - lipgloss.Width(sep)); hint != "" {
		return style.Render(msg) + plainStyle.Render(sep+hint)
	}
	return style.Render(ansi.Truncate(msg, w, "…"))
}

func (m Model) narrowBody(w, h int) string {
	var lines []string
	switch m.focus {
	case panelDedup:
		lines = m.dedupLines(w-2, true)
	case panelKeys:
		lines = m.keyLines(w-2, h-2)
	case panelOutbox:
		lines = m.outboxLines(w - 2)
	case panelConfig:
		lines = m.configLines(w - 2)
	}
	return box(panelNames[m.focus], lines, w, h, true)
}

func (m Model) wideBody(w, h int) string {
	topH := h * 3 / 5
	bottomH := h - topH
	cw := w / 3
	dedup := box("Dedup", m.dedupLines(cw-2, false), cw, topH, m.focus == panelDedup)
	keys := box("Keys", m.keyLines(cw-2, topH-2), cw, topH, m.focus == panelKeys)
	config := box("Config & tuning", m.configLines(w-2*cw-2), w-2*cw, topH, m.focus == panelConfig)
	top := lipgloss.JoinHorizontal(lipgloss.Top, dedup, keys, config)
	outbox := box("Outbox", m.outboxLines(w-2), w, bottomH, m.focus == panelOutbox)
	return top + "\n" + outbox
}

func (m Model) overlay(w, h int, title, text string) string {
	content := titleStyle.Render(title) + "\n\n" + text
	return lipgloss.Place(w, h, lipgloss.Center, lipgloss.Center, overlayStyle.Render(content))
}

// box draws lines in a w×h frame titled title.
func box(title string, lines []string, w, h int, focused bool) string {
	style := plainStyle
	if focused {
		style = focusStyle
	}
	inner := max(w-2, 1)
	t := ansi.Truncate(" "+title+" ", inner, "")
	top := style.Render("┌" + t + strings.Repeat("─", max(inner-lipgloss.Width(t), 0)) + "┐")
	out := []string{top}
	for i := 0; i < h-2; i++ {
		l := ""
		if i < len(lines) {
			l = lines[i]
		}
		out = append(out, style.Render("│")+pad(l, inner)+style.Render("│"))
	}
	out = append(out, style.Render("└"+strings.Repeat("─", inner)+"┘"))
	return strings.Join(out, "\n")
}

// pad truncates or pads s to exactly w cells.
func pad(s string, w int) string {
	s = ansi.Truncate(s, w, "…")
	return s + strings.Repeat(" ", max(w-lipgloss.Width(s), 0))
}

// fit makes s exactly h lines of at most w cells.
func fit(s string, w, h int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > h {
		lines = lines[:h]
	}
	for len(lines) < h {
		lines = append(lines, "")
	}
	for i, l := range lines {
		lines[i] = ansi.Truncate(l, w, "")
	}
	return strings.Join(lines, "\n")
}

func wrap(s string, w int) string {
	var out []string
	line := ""
	for _, word := range strings.Fields(s) {
		if line != "" && len(line)+1+len(word) > w {
			out = append(out, line)
			line = word
			continue
		}
		if line != "" {
			line += " "
		}
		line += word
	}
	return strings.Join(append(out, line), "\n")
}

// gauge draws a bar of width w filled to ratio.
func gauge(ratio float64, w int) string {
	ratio = math.Max(0, math.Min(1, ratio))
	n := int(math.Round(ratio * float64(w)))
	return "[" + strings.Repeat("█", n) + strings.Repeat("░", w-n) + "]"
}

var sparks = []rune("▁▂▃▄▅▆▇█")

// sparkline draws one cell per value, scaled to the largest.
func sparkline(vals []int64) string {
	var top int64
	for _, v := range vals {
		top = max(top, v)
	}
	var b strings.Builder
	for _, v := range vals {
		if top == 0 || v == 0 {
			b.WriteRune(' ')
			continue
		}
		b.WriteRune(sparks[min(int(float64(v)/float64(top)*float64(len(sparks)-1)+0.5), len(sparks)-1)])
	}
	return b.String()
}

func (m Model) dedupLines(w int, withCounts bool) []string {
	if m.snap == nil {
		return []string{"loading…"}
	}
	d := m.snap.Dedup
	if d == nil {
		return []string{"dedup record unavailable (see the status line)"}
	}
	gw := max(min(w-24, 30), 5)
	lines := []string{
		fmt.Sprintf("Hit rate 24h %s %5.1f%%", gauge(d.HitRate, gw), d.HitRate*100),
		fmt.Sprintf("%d duplicates blocked of %d received", d.Duplicates, d.Received),
	}
	if p := m.snap.Process; p != nil {
		rate := 0.0
		if p.Received > 0 {
			rate = p.Duplicates / p.Received
		}
		lines = append(lines, fmt.Sprintf("process: %.0f of %.0f (%.1f%%) since start", p.Duplicates, p.Received, rate*100))
	}
	dups := make([]int64, len(d.Hourly))
	var peak int64
	for i, h := range d.Hourly {
		dups[i] = h.Duplicates
		peak = max(peak, h.Duplicates)
	}
	lines = append(lines,
		fmt.Sprintf("24h |%s| peak %d/h", sparkline(dups), peak),
		fmt.Sprintf("record %d rows · %s · cap %d", d.RecordRows, admin.HumanBytes(d.RecordBytes), m.cfg.DedupRecordMax),
		"window "+fmtDur(m.cfg.DedupWindow),
	)
	if st := m.snap.Stats; st != nil {
		var rows int64
		for _, n := range st.Inbox.ByStatus {
			rows += n
		}
		lines = append(lines, fmt.Sprintf("inbox table %d rows · %s", rows, admin.HumanBytes(st.Inbox.TableBytes)))
	}
	if withCounts && m.snap.Stats != nil {
		st := m.snap.Stats
		lines = append(lines, fmt.Sprintf("inbox: %d pending · %d processing · %d processed · %d dead",
			st.Inbox.ByStatus["pending"], st.Inbox.ByStatus["processing"], st.Inbox.ByStatus["processed"], st.Inbox.ByStatus["dead"]))
		lines = append(lines, fmt.Sprintf("lag %s · outbox %d pending · %d dead",
			fmtDur(secs(st.Inbox.OldestClaimableSeconds)), st.Outbox.ByStatus["pending"], st.Outbox.ByStatus["dead"]))
	}
	lines = append(lines, "", titleStyle.Render("Recent duplicates blocked"))
	idW := max(w-30, 8)
	lines = append(lines, fmt.Sprintf("%-6s %-*s %-10s %s", "SEEN", idW, "EVENT ID", "HANDLER", "ORIGINAL"))
	if len(d.Recent) == 0 {
		lines = append(lines, "none recorded")
	}
	for _, r := range d.Recent {
		orig := "same batch"
		if r.OriginalReceivedAt != nil {
			orig = fmtDur(secs(r.OriginalAgeSeconds)) + " old"
		}
		handler := r.Handler
		if handler == "" {
			handler = "-"
		}
		lines = append(lines, fmt.Sprintf("%-6s %-*s %-10s %s", ago(m.snap.At, r.SeenAt), idW, ansi.Truncate(r.EventID, idW, "…"),
			ansi.Truncate(handler, 10, "…"), orig))
	}
	return lines
}

func (m Model) keyLines(w, h int) []string {
	if m.snap == nil {
		return []string{"loading…"}
	}
	q := "all recent keys"
	if m.query != "" {
		q = "search /" + m.query + " (Esc clears)"
	}
	lines := []string{fmt.Sprintf("%d keys · %s", len(m.snap.Keys), q)}
	idW := max(w-34, 8)
	lines = append(lines, fmt.Sprintf("  %-*s %-10s %3s %s", idW, "EVENT ID", "STATUS", "ATT", "RETENTION"))
	if len(m.snap.Keys) == 0 {
		return append(lines, "  no keys")
	}
	rows := max(h-len(lines), 1)
	start := 0
	if m.cursor >= rows {
		start = m.cursor - rows + 1
	}
	for i := start; i < len(m.snap.Keys) && i < start+rows; i++ {
		k := m.snap.Keys[i]
		mark := "  "
		if i == m.cursor {
			mark = "> "
		}
		line := fmt.Sprintf("%s%-*s %-10s %3d %s", mark, idW, ansi.Truncate(k.EventID, idW, "…"), k.Status, k.Attempts, m.retentionLeft(k))
		if i == m.cursor {
			line = focusStyle.Render(line)
		}
		lines = append(lines, line)
	}
	return lines
}

// retentionLeft is how long until retention deletes the key.
func (m Model) retentionLeft(k admin.InboxKey) string {
	switch {
	case k.Status == "dead":
		return "kept (dead)"
	case k.Status != "processed" || k.FinishedAt == nil:
		return "-"
	}
	left := k.FinishedAt.Add(m.cfg.DedupWindow).Sub(m.snap.At)
	if left <= 0 {
		return "due"
	}
	return fmtDur(left)
}

func (m Model) outboxLines(w int) []string {
	if m.snap == nil {
		return []string{"loading…"}
	}
	ov := m.snap.Outbox
	if ov == nil {
		return []string{"outbox unavailable (see the status line)"}
	}
	var pending, dead int64
	held := 0
	for _, p := range ov.Partitions {
		pending += p.Pending
		dead += p.Dead
		if p.Held {
			held++
		}
	}
	lines := []string{fmt.Sprintf("relays alive %d of %d · partitions held %d of %d · pending %d · dead %d",
		alive(ov), len(ov.Relays), held, len(ov.Partitions), pending, dead)}
	for _, r := range ov.Relays {
		state := "alive"
		if !r.Alive {
			state = "gone"
		}
		lines = append(lines, fmt.Sprintf("  relay %s: %s, %d partitions, seen %s ago", r.NodeID, state, r.Partitions, ago(m.snap.At, r.LastSeen)))
	}
	// Partitions in as many columns as the width allows.
	const colW = 56
	cols := max(w/(colW+2), 1)
	head := fmt.Sprintf("%4s %-22s %5s %7s %7s %5s", "PART", "OWNER", "EPOCH", "PENDING", "LAG", "DEAD")
	hl := make([]string, cols)
	for i := range hl {
		hl[i] = pad(head, colW)
	}
	lines = append(lines, strings.Join(hl, "  "))
	perCol := (len(ov.Partitions) + cols - 1) / cols
	for r := 0; r < perCol; r++ {
		var cells []string
		for c := 0; c < cols; c++ {
			i := c*perCol + r
			if i >= len(ov.Partitions) {
				break
			}
			p := ov.Partitions[i]
			owner := p.Owner
			if !p.Held {
				owner = "(free)"
			}
			cells = append(cells, pad(fmt.Sprintf("%4d %-22s %5d %7d %7s %5d", p.Partition, ansi.Truncate(owner, 22, "…"), p.Epoch,
				p.Pending, fmtDur(secs(p.LagSeconds)), p.Dead), colW))
		}
		lines = append(lines, strings.Join(cells, "  "))
	}
	return lines
}

func (m Model) configLines(w int) []string {
	lines := []string{titleStyle.Render("Effective settings")}
	for _, s := range m.cfg.Settings {
		lines = append(lines, fmt.Sprintf("%-18s %s", s.Name, s.Value))
	}
	if m.snap != nil && m.snap.Stream != nil {
		s := m.snap.Stream
		maxAge := "unlimited"
		if s.MaxAge > 0 {
			maxAge = fmtDur(s.MaxAge)
		}
		lines = append(lines, fmt.Sprintf("%-18s %s", "stream MaxAge", maxAge),
			fmt.Sprintf("%-18s %s", "stream dup window", fmtDur(s.Duplicates)))
	}
	lines = append(lines, "", titleStyle.Render("Advice"))
	for _, a := range Advise(m.snap, m.cfg.DedupWindow, m.cfg.DedupRecordMax) {
		for i, l := range strings.Split(wrap(a, max(w-2, 10)), "\n") {
			if i == 0 {
				lines = append(lines, "• "+l)
			} else {
				lines = append(lines, "  "+l)
			}
		}
	}
	return lines
}

func (m Model) detailText(w int) string {
	d := m.detail
	rows := [][2]string{
		{"status", d.Status}, {"topic", d.Topic}, {"key", d.Key}, {"event type", d.EventType},
		{"attempts", fmt.Sprint(d.Attempts)}, {"received", tstamp(d.ReceivedAt)}, {"finished", tstamp(d.DeadAt)},
		{"last error", d.LastError}, {"payload", d.Payload},
	}
	var b strings.Builder
	for _, r := range rows {
		fmt.Fprintf(&b, "%-11s %s\n", r[0], ansi.Truncate(strings.Join(strings.Fields(r[1]), " "), w-12, "…"))
	}
	if d.Status == "dead" {
		b.WriteString("\nd: purge this dead event   any other key: close")
	} else {
		b.WriteString("\nany key: close")
	}
	return b.String()
}

func tstamp(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func ago(now, t time.Time) string {
	return fmtDur(max(now.Sub(t), 0))
}

// fmtDur prints a duration compactly: 45s, 12m, 3h20m, 6d23h.
func fmtDur(d time.Duration) string {
	switch {
	case d < time.Second:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	default:
		return fmt.Sprintf("%dd%02dh", int(d.Hours())/24, int(d.Hours())%24)
	}
}
