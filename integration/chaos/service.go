package chaos

import (
	"bufio"
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pgrelay/pgrelay/internal/proc"
)

// scraped lists the counters read from the services' /metrics endpoints.
var scraped = []string{
	"consumer_fenced_total", "relay_fenced_total",
	"consumer_lease_takeovers_total", "relay_lease_takeovers_total",
	"consumer_retries_total", "consumer_dedup_total", "relay_publish_duplicates_total",
}

// service is one relay or consumer process, with the counters scraped from
// its metrics endpoint summed over its restarts.
type service struct {
	name        string
	metricsAddr string
	proc        *proc.Process

	mu     sync.Mutex
	starts int
	paused bool
	base   map[string]float64 // totals of the previous incarnations
	last   map[string]float64 // the current incarnation's last scrape
}

// start starts the process, folding the previous incarnation's last scrape
// into the totals (counters restart at zero with the process).
func (s *service) start() error {
	s.mu.Lock()
	if s.base == nil {
		s.base = map[string]float64{}
	}
	for k, v := range s.last {
		s.base[k] += v
	}
	s.last = nil
	s.starts++
	s.paused = false
	s.mu.Unlock()
	return s.proc.Start()
}

func (s *service) setPaused(p bool) {
	s.mu.Lock()
	s.paused = p
	s.mu.Unlock()
}

// metrics returns the scraped counters summed over every incarnation.
func (s *service) metrics() map[string]float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := map[string]float64{}
	for k, v := range s.base {
		m[k] += v
	}
	for k, v := range s.last {
		m[k] += v
	}
	return m
}

// scrape reads the counters once; a failure leaves the last values.
func (s *service) scrape(ctx context.Context) {
	s.mu.Lock()
	paused := s.paused
	s.mu.Unlock()
	if paused || !s.proc.Running() {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.metricsAddr+"/metrics", nil)
	if err != nil {
		return
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	got := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		if i := strings.IndexByte(name, '{'); i >= 0 {
			name = name[:i]
			if j := strings.LastIndexByte(line, ' '); j >= 0 {
				rest = line[j+1:]
			}
		}
		for _, want := range scraped {
			if strings.HasSuffix(name, want) {
				if v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64); err == nil {
					got[want] += v
				}
			}
		}
	}
	if sc.Err() != nil {
		return
	}
	s.mu.Lock()
	s.last = got
	s.mu.Unlock()
}

// scrapeLoop scrapes every service every second until ctx ends, so that a
// SIGKILL loses at most a second of counts.
func (r *run) scrapeLoop(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		for _, s := range r.svcs {
			s.scrape(ctx)
		}
		select {
		case <-ctx.Done():
			for _, s := range r.svcs { // the final counts before the stop
				s.scrape(context.Background())
			}
			return
		case <-t.C:
		}
	}
}
