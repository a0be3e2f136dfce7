package main

import (
	"slices"
	"time"
)

// Units of the figures.
const (
	unitRate = "events/s"
	unitMs   = "ms"
	unitMiB  = "MiB"
	unitCPU  = "cpu-s/10k events"
	// unitCPUEvent is CPU time per event, in milliseconds.
	unitCPUEvent = "cpu-ms/event"
	// unitBusy is the machine's busy share, in percent.
	unitBusy = "% busy"
)

// Target is the bound a figure is compared with.
type Target struct {
	// Kind is "ratio>=" (the figure divided by its floor must reach Value),
	// "<=" or ">=" (the figure itself, in its unit).
	Kind  string  `json:"kind"`
	Value float64 `json:"value"`
	// Text is the target as the issue states it.
	Text string `json:"text"`
}

// Figure is one measured quantity: its samples over the repeats and their
// summary. A figure that could not be measured carries the reason instead.
type Figure struct {
	ID    string `json:"id"`
	Group string `json:"group"`
	Name  string `json:"name"`
	Unit  string `json:"unit"`
	// Floor is the ID of the floor figure this one is compared with.
	Floor string `json:"floor,omitempty"`
	// Target is the bound from the issue, when there is one.
	Target *Target `json:"target,omitempty"`
	// Mode says how pgrelay ran: "sql" (floors), "in-process" or "process".
	Mode    string    `json:"mode"`
	Samples []float64 `json:"samples"`
	Median  float64   `json:"median"`
	Min     float64   `json:"min"`
	Max     float64   `json:"max"`
	// Ratio is Median divided by the floor's median, when there is a floor.
	Ratio float64 `json:"ratio,omitempty"`
	// Met reports whether the target is met (nil without a target).
	Met *bool `json:"met,omitempty"`
	// Note explains how the figure was obtained.
	Note string `json:"note,omitempty"`
	// Error is why the figure is missing or incomplete.
	Error string `json:"error,omitempty"`
}

func (f *Figure) add(v float64) {
	f.Samples = append(f.Samples, v)
}

func (f *Figure) summarize() {
	if len(f.Samples) == 0 {
		return
	}
	s := slices.Clone(f.Samples)
	slices.Sort(s)
	f.Min, f.Max = s[0], s[len(s)-1]
	f.Median = median(s)
}

func median(sorted []float64) float64 {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}

func rate(events int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(events) / d.Seconds()
}

// Results is everything one run measured, as written to results.json.
type Results struct {
	Started  time.Time         `json:"started"`
	Finished time.Time         `json:"finished"`
	Quick    bool              `json:"quick"`
	Machine  Machine           `json:"machine"`
	Settings map[string]any    `json:"settings"`
	Postgres map[string]string `json:"postgres_settings"`
	Figures  []*Figure         `json:"figures"`
}

// figure returns the figure with the given ID, creating it on first use.
func (r *Results) figure(id, group, name, unit string) *Figure {
	for _, f := range r.Figures {
		if f.ID == id {
			return f
		}
	}
	f := &Figure{ID: id, Group: group, Name: name, Unit: unit}
	r.Figures = append(r.Figures, f)
	return f
}

func (r *Results) lookup(id string) *Figure {
	for _, f := range r.Figures {
		if f.ID == id {
			return f
		}
	}
	return nil
}

// finish summarizes every figure, computes the ratios to the floors and
// checks the targets.
func (r *Results) finish() {
	for _, f := range r.Figures {
		f.summarize()
	}
	for _, f := range r.Figures {
		if len(f.Samples) == 0 {
			continue
		}
		var value float64
		if f.Floor != "" {
			if fl := r.lookup(f.Floor); fl != nil && fl.Median > 0 {
				f.Ratio = f.Median / fl.Median
			}
		}
		if f.Target == nil {
			continue
		}
		switch f.Target.Kind {
		case "ratio>=":
			if f.Ratio == 0 {
				continue
			}
			value = f.Ratio
		default:
			value = f.Median
		}
		met := value >= f.Target.Value
		if f.Target.Kind == "<=" {
			met = value <= f.Target.Value
		}
		f.Met = &met
	}
}
