package admin

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The consumer counters the dedup hit rate is computed from.
const (
	metricReceived   = "consumer_received_total"
	metricDuplicates = "consumer_dedup_total"
)

// ScrapeCounters returns a Config.Counters function that reads the received
// and duplicate counters from a consumer's Prometheus endpoint (summed over
// their labels). It reports ok=false when the endpoint cannot be read.
func ScrapeCounters(ctx context.Context, metricsURL string) func() (float64, float64, bool) {
	return func() (float64, float64, bool) {
		received, dups, err := scrape(ctx, metricsURL)
		if err != nil {
			return 0, 0, false
		}
		return received, dups, true
	}
}

func scrape(ctx context.Context, metricsURL string) (received, dups float64, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, metricsURL, nil)
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Accept", "text/plain; version=0.0.4")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, 0, fmt.Errorf("GET %s: %s", metricsURL, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return 0, 0, err
	}
	sum := func(name string) float64 {
		var total float64
		if f, ok := fams[name]; ok {
			for _, m := range f.GetMetric() {
				total += m.GetCounter().GetValue()
			}
		}
		return total
	}
	if _, ok := fams[metricReceived]; !ok {
		return 0, 0, fmt.Errorf("%s has no %s", metricsURL, metricReceived)
	}
	return sum(metricReceived), sum(metricDuplicates), nil
}
