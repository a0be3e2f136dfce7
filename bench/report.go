package main

import (
	"encoding/json"
	"fmt"
	"html"
	"math"
	"os"
	"path/filepath"
	"strings"
)

// writeResults writes results.json, results.txt and results.svg.
func writeResults(dir string, r *Results) error {
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encode results: %w", err)
	}
	files := map[string][]byte{
		"results.json": append(js, '\n'),
		"results.txt":  []byte(renderTable(r)),
		"results.svg":  []byte(renderSVG(r)),
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
	}
	return nil
}

// renderTable renders every figure next to its floor, the ratio and the
// target, as plain text.
func renderTable(r *Results) string {
	var sb strings.Builder
	m := r.Machine
	fmt.Fprintf(&sb, "pgrelay benchmark  %s  (%s)\n", r.Started.Format("2006-01-02 15:04 UTC"), map[bool]string{true: "quick: proves it runs, not a measurement", false: "full"}[r.Quick])
	fmt.Fprintf(&sb, "machine: %d CPUs %s, %d MiB, kernel %s, load %s\n", m.CPUs, m.CPUModel, m.MemoryMiB, m.Kernel, m.LoadAvg)
	fmt.Fprintf(&sb, "%s; %s; NATS %s (%s); synchronous_commit=%s\n", m.GoVersion, firstWords(m.Postgres, 2), m.NATS, m.NATSServer, r.Postgres["synchronous_commit"])
	if where, ok := r.Settings["kafka"]; ok {
		fmt.Fprintf(&sb, "relay drains publish to Kafka: %v\n", where)
	}
	fmt.Fprintf(&sb, "settings: %v\n", settingsLine(r.Settings))
	if o, ok := r.Settings["observer"]; ok {
		fmt.Fprintf(&sb, "observer: %v\n", o)
	}
	sb.WriteString("\n")

	rows := [][]string{{"group", "figure", "median", "min … max", "n", "floor", "ratio", "target", ""}}
	for _, f := range r.Figures {
		row := []string{f.Group, f.Name}
		if len(f.Samples) == 0 {
			reason := f.Error
			if reason == "" {
				reason = "not measured"
			}
			row = append(row, "—", "", "", "", "", targetText(f), "n/a: "+oneLine(reason, 70))
			rows = append(rows, row)
			continue
		}
		row = append(row, value(f.Median, f.Unit), value(f.Min, f.Unit)+" … "+value(f.Max, f.Unit), fmt.Sprint(len(f.Samples)))
		floor, ratio := "", ""
		if fl := r.lookup(f.Floor); fl != nil && len(fl.Samples) > 0 {
			floor = value(fl.Median, fl.Unit)
		}
		if f.Ratio > 0 {
			ratio = fmt.Sprintf("%.2f×", f.Ratio)
		}
		verdict := ""
		if f.Met != nil {
			verdict = map[bool]string{true: "met", false: "MISSED"}[*f.Met]
		}
		if f.Error != "" {
			verdict += " (partial: " + oneLine(f.Error, 50) + ")"
		}
		row = append(row, floor, ratio, targetText(f), strings.TrimSpace(verdict))
		rows = append(rows, row)
	}
	widths := make([]int, len(rows[0]))
	for _, row := range rows {
		for i, c := range row {
			widths[i] = max(widths[i], len([]rune(c)))
		}
	}
	for i, row := range rows {
		for j, c := range row {
			pad := widths[j] - len([]rune(c))
			if j >= 2 && j <= 6 { // numbers right-aligned
				sb.WriteString(strings.Repeat(" ", pad) + c)
			} else {
				sb.WriteString(c + strings.Repeat(" ", pad))
			}
			sb.WriteString("  ")
		}
		trimmed := strings.TrimRight(sb.String(), " ")
		sb.Reset()
		sb.WriteString(trimmed + "\n")
		if i == 0 {
			total := 0
			for _, w := range widths {
				total += w + 2
			}
			sb.WriteString(strings.Repeat("-", total) + "\n")
		}
	}
	sb.WriteString(renderCPU(r))
	return sb.String()
}

// renderCPU renders the runs' CPU per event as one line per run, beside the
// run's latency: the same figures as the table's cpu rows, side by side.
func renderCPU(r *Results) string {
	comps := []string{cpuRelay, cpuConsumer, cpuNATS, cpuPostgres, cpuBench, cpuOther}
	rows := [][]string{{"run", "p50", "p99", "relay", "consumer", "nats", "postgres", "bench", "other", "busy"}}
	cell := func(id string) string {
		f := r.lookup(id)
		switch {
		case f == nil:
			return "·"
		case len(f.Samples) == 0:
			return "n/a"
		case f.Unit == unitBusy:
			return fmt.Sprintf("%.0f%%", f.Median)
		case f.Unit == unitCPUEvent:
			return fmt.Sprintf("%.3f", f.Median)
		}
		return value(f.Median, f.Unit)
	}
	inProcess := false
	for _, f := range r.Figures {
		run, ok := strings.CutSuffix(strings.TrimPrefix(f.ID, "cpu_"), "_"+cpuBusy)
		if !ok || !strings.HasPrefix(f.ID, "cpu_") {
			continue
		}
		lat := ""
		switch {
		case run == "e2e_one":
			lat = "latency_max"
		case strings.HasPrefix(run, "load_"):
			lat = "latency_" + strings.TrimPrefix(run, "load_")
		}
		row := []string{strings.TrimPrefix(f.Name, "  machine busy, "), "", ""}
		if lat != "" {
			row[1], row[2] = cell(lat+"_p50"), cell(lat+"_p99")
		}
		for _, c := range comps {
			row = append(row, cell(cpuFigureID(run, c)))
		}
		row = append(row, cell(f.ID))
		if f.Group == "e2e" && r.lookup(cpuFigureID(run, cpuRelay)) == nil {
			inProcess = true
		}
		rows = append(rows, row)
	}
	if len(rows) == 1 {
		return ""
	}
	var sb strings.Builder
	sb.WriteString("\nCPU per event (ms of CPU per event, medians; busy: the machine's busy share over the run; n/a: see the table)\n")
	if inProcess {
		sb.WriteString("relay and consumer in-process: their CPU is in the bench column (one process)\n")
	}
	widths := make([]int, len(rows[0]))
	for _, row := range rows {
		for i, c := range row {
			widths[i] = max(widths[i], len([]rune(c)))
		}
	}
	for _, row := range rows {
		var line strings.Builder
		for j, c := range row {
			pad := strings.Repeat(" ", widths[j]-len([]rune(c)))
			if j == 0 {
				line.WriteString(c + pad)
			} else {
				line.WriteString(pad + c)
			}
			line.WriteString("  ")
		}
		sb.WriteString(strings.TrimRight(line.String(), " ") + "\n")
	}
	return sb.String()
}

func targetText(f *Figure) string {
	if f.Target == nil {
		return ""
	}
	return f.Target.Text
}

func value(v float64, unit string) string {
	switch unit {
	case unitRate:
		return thousands(int64(math.Round(v))) + "/s"
	case unitMs:
		if v < 10 {
			return fmt.Sprintf("%.2f ms", v)
		}
		return fmt.Sprintf("%.1f ms", v)
	case unitMiB:
		return fmt.Sprintf("%.1f MiB", v)
	case unitCPU:
		return fmt.Sprintf("%.2f cpu-s", v)
	case unitCPUEvent:
		return fmt.Sprintf("%.3f cpu-ms", v)
	case unitBusy:
		return fmt.Sprintf("%.0f%% busy", v)
	}
	return fmt.Sprintf("%.2f %s", v, unit)
}

func thousands(n int64) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return "-" + thousands(-n)
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

func firstWords(s string, n int) string {
	f := strings.Fields(s)
	return strings.Join(f[:min(n, len(f))], " ")
}

func settingsLine(s map[string]any) string {
	keys := []string{"repeats", "events", "batch_size", "workers", "prefill", "load_duration", "loads", "relay_instances", "relay_databases"}
	var parts []string
	for _, k := range keys {
		if v, ok := s[k]; ok {
			parts = append(parts, fmt.Sprintf("%s=%v", k, v))
		}
	}
	return strings.Join(parts, " ")
}

// renderSVG draws two panels by hand: each throughput figure as a bar next to
// its floor, and the commit→ledger latency percentiles per offered load.
func renderSVG(r *Results) string {
	type bar struct {
		label        string
		value, floor float64
		ratio        float64
	}
	var bars []bar
	for _, f := range r.Figures {
		if f.Unit != unitRate || f.Group == "floor" || len(f.Samples) == 0 {
			continue
		}
		b := bar{label: strings.TrimSpace(f.Name), value: f.Median, ratio: f.Ratio}
		if fl := r.lookup(f.Floor); fl != nil && len(fl.Samples) > 0 && fl.Unit == unitRate {
			b.floor = fl.Median
		}
		bars = append(bars, b)
	}
	type lat struct {
		label         string
		p50, p99, max float64
	}
	var lats []lat
	for _, f := range r.Figures {
		if f.Unit != unitMs || !strings.HasSuffix(f.ID, "_p50") || len(f.Samples) == 0 {
			continue
		}
		base := strings.TrimSuffix(f.ID, "_p50")
		l := lat{label: strings.TrimPrefix(f.Name, "commit→ledger p50, "), p50: f.Median}
		if g := r.lookup(base + "_p99"); g != nil {
			l.p99 = g.Median
		}
		if g := r.lookup(base + "_max"); g != nil {
			l.max = g.Median
		}
		lats = append(lats, l)
	}

	const width, left, right, rowH = 900, 330, 110, 30
	var sb strings.Builder
	y := 50
	panel1 := y + 20 + rowH*max(1, len(bars))
	height := panel1 + 80 + 3*22*max(1, len(lats)) + 40*max(1, len(lats)) + 40
	fmt.Fprintf(&sb, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", width, height)
	fmt.Fprintf(&sb, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&sb, `<text x="10" y="22" font-size="16" font-weight="bold">pgrelay throughput vs floor (median events/s) — %s, %d CPUs</text>`+"\n",
		r.Started.Format("2006-01-02"), r.Machine.CPUs)
	fmt.Fprintf(&sb, `<text x="10" y="40" fill="#555">grey: floor (plain SQL, same batch size); blue: pgrelay; label: ratio to floor</text>`+"\n")
	maxV := 1.0
	for _, b := range bars {
		maxV = math.Max(maxV, math.Max(b.value, b.floor))
	}
	scale := float64(width-left-right) / maxV
	for i, b := range bars {
		by := y + 10 + i*rowH
		fmt.Fprintf(&sb, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", left-8, by+15, html.EscapeString(oneLine(b.label, 52)))
		if b.floor > 0 {
			fmt.Fprintf(&sb, `<rect x="%d" y="%d" width="%.1f" height="22" fill="#ccc"/>`+"\n", left, by+2, b.floor*scale)
		}
		fmt.Fprintf(&sb, `<rect x="%d" y="%d" width="%.1f" height="12" fill="#2b6cb0"/>`+"\n", left, by+7, b.value*scale)
		txt := thousands(int64(math.Round(b.value))) + "/s"
		if b.ratio > 0 {
			txt += fmt.Sprintf(" (%.2f×)", b.ratio)
		}
		fmt.Fprintf(&sb, `<text x="%.1f" y="%d">%s</text>`+"\n", float64(left)+math.Max(b.value, b.floor)*scale+6, by+17, html.EscapeString(txt))
	}
	if len(bars) == 0 {
		fmt.Fprintf(&sb, `<text x="%d" y="%d" fill="#999">no pgrelay throughput measured in this run</text>`+"\n", left, y+25)
	}

	y = panel1 + 30
	fmt.Fprintf(&sb, `<text x="10" y="%d" font-size="16" font-weight="bold">commit → ledger latency (median of repeats, ms; log scale)</text>`+"\n", y)
	fmt.Fprintf(&sb, `<text x="10" y="%d" fill="#555">p50 green, p99 orange, max red; dashed: 10 ms and 50 ms targets at 500/s</text>`+"\n", y+18)
	y += 30
	maxL := 100.0
	for _, l := range lats {
		maxL = math.Max(maxL, l.max)
	}
	logScale := func(v float64) float64 {
		return math.Log10(math.Max(v, 0.1)/0.1) / math.Log10(maxL/0.1) * float64(width-left-right)
	}
	for _, t := range []float64{10, 50} {
		x := float64(left) + logScale(t)
		fmt.Fprintf(&sb, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#999" stroke-dasharray="4 3"/>`+"\n", x, y, x, y+(3*22+14)*max(1, len(lats)))
		fmt.Fprintf(&sb, `<text x="%.1f" y="%d" fill="#999" text-anchor="middle">%g ms</text>`+"\n", x, y-2, t)
	}
	for i, l := range lats {
		ly := y + 6 + i*(3*22+14)
		fmt.Fprintf(&sb, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", left-8, ly+36, html.EscapeString(oneLine(l.label, 52)))
		for j, p := range []struct {
			name  string
			v     float64
			color string
		}{{"p50", l.p50, "#38a169"}, {"p99", l.p99, "#dd6b20"}, {"max", l.max, "#c53030"}} {
			py := ly + j*22
			fmt.Fprintf(&sb, `<rect x="%d" y="%d" width="%.1f" height="18" fill="%s"/>`+"\n", left, py, logScale(p.v), p.color)
			fmt.Fprintf(&sb, `<text x="%.1f" y="%d">%s %s</text>`+"\n", float64(left)+logScale(p.v)+6, py+13, p.name, html.EscapeString(value(p.v, unitMs)))
		}
	}
	if len(lats) == 0 {
		fmt.Fprintf(&sb, `<text x="%d" y="%d" fill="#999">no latency measured in this run</text>`+"\n", left, y+25)
	}
	sb.WriteString("</svg>\n")
	return sb.String()
}
