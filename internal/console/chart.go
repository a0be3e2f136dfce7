package console

import (
	"fmt"
	"html"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// counterSeries are the process counters the console samples, summed over
// every label but handler and database.
var counterSeries = []struct{ metric, label string }{
	{"consumer_processed_total", "processed"},
	{"consumer_retries_total", "retries"},
	{"consumer_dlq_total", "dead"},
	{"consumer_received_total", "received"},
	{"consumer_dedup_total", "duplicates"},
	{"relay_published_total", "published"},
	{"relay_publish_errors_total", "publish errors"},
	{"relay_dead_total", "dead"},
}

// seriesKey names one sampled counter: its label, handler and database (""
// when the metric has none).
type seriesKey struct{ label, handler, database string }

type sample struct {
	at     time.Time
	values map[seriesKey]float64
}

// sampler keeps the process's counters over a window, sampled by Run.
type sampler struct {
	g      prometheus.Gatherer
	every  time.Duration
	window time.Duration

	mu      sync.Mutex
	samples []sample
	err     string
}

func newSampler(g prometheus.Gatherer, every, window time.Duration) *sampler {
	return &sampler{g: g, every: every, window: window}
}

func (s *sampler) sample(now time.Time) {
	if s.g == nil {
		return
	}
	fams, err := s.g.Gather()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.err = err.Error()
		// Gather returns what it could; use it.
	}
	vals := map[seriesKey]float64{}
	for _, f := range fams {
		for _, cs := range counterSeries {
			if f.GetName() != cs.metric {
				continue
			}
			for _, m := range f.GetMetric() {
				k := seriesKey{label: cs.label}
				for _, lp := range m.GetLabel() {
					switch lp.GetName() {
					case "handler":
						k.handler = lp.GetValue()
					case "database":
						k.database = lp.GetValue()
					}
				}
				vals[k] += m.GetCounter().GetValue()
			}
		}
	}
	s.samples = append(s.samples, sample{at: now, values: vals})
	cut := now.Add(-s.window - s.every)
	i := 0
	for i < len(s.samples) && s.samples[i].at.Before(cut) {
		i++
	}
	s.samples = slices.Delete(s.samples, 0, i)
}

// processSeries is one sampled counter, as increments per minute.
type processSeries struct {
	Label, Handler string
	Total          float64
	Minutes        []int64
}

// perMinute returns each sampled counter's increments per minute over the
// last `minutes` minutes (oldest first, the last one the current minute),
// and how long the samples cover: of database's series only (their
// database label), or, with database "", of every series, summed.
func (s *sampler) perMinute(now time.Time, minutes int, database string) ([]processSeries, time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.samples) < 2 {
		return nil, 0
	}
	current := now.Truncate(time.Minute)
	first := current.Add(-time.Duration(minutes-1) * time.Minute)
	byKey := map[seriesKey]*processSeries{}
	var keys []seriesKey
	for i := 1; i < len(s.samples); i++ {
		prev, cur := s.samples[i-1], s.samples[i]
		m := int(cur.at.Truncate(time.Minute).Sub(first) / time.Minute)
		for k, v := range cur.values {
			if database != "" && k.database != database {
				continue
			}
			sk := seriesKey{label: k.label, handler: k.handler}
			ps := byKey[sk]
			if ps == nil {
				ps = &processSeries{Label: k.label, Handler: k.handler, Minutes: make([]int64, minutes)}
				byKey[sk] = ps
				keys = append(keys, sk)
			}
			d := v - prev.values[k]
			if d < 0 {
				d = v // the counter was reset
			}
			if m >= 0 && m < minutes {
				ps.Minutes[m] += int64(d + 0.5)
				ps.Total += d
			}
		}
	}
	slices.SortFunc(keys, func(a, b seriesKey) int {
		if c := strings.Compare(a.handler, b.handler); c != 0 {
			return c
		}
		return strings.Compare(a.label, b.label)
	})
	out := make([]processSeries, 0, len(keys))
	for _, k := range keys {
		out = append(out, *byKey[k])
	}
	return out, s.samples[len(s.samples)-1].at.Sub(s.samples[0].at)
}

// barChart draws values as an inline SVG bar chart (no script; the title
// is its accessible name and tooltip).
func barChart(title string, values []int64, class string) string {
	const w, h, pad = 240, 48, 2
	var peak int64
	for _, v := range values {
		peak = max(peak, v)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart %s" viewBox="0 0 %d %d" preserveAspectRatio="none" role="img" aria-label="%s"><title>%s</title>`,
		html.EscapeString(class), w, h, html.EscapeString(title), html.EscapeString(title))
	fmt.Fprintf(&b, `<line x1="0" y1="%d" x2="%d" y2="%d" class="axis"/>`, h-1, w, h-1)
	if n := len(values); n > 0 && peak > 0 {
		bw := float64(w) / float64(n)
		for i, v := range values {
			if v == 0 {
				continue
			}
			bh := float64(h-pad) * float64(v) / float64(peak)
			fmt.Fprintf(&b, `<rect x="%.2f" y="%.2f" width="%.2f" height="%.2f"/>`, float64(i)*bw+0.5, float64(h)-bh, max(bw-1, 0.5), bh)
		}
	}
	b.WriteString(`</svg>`)
	return b.String()
}
