package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/internal/testnats"
)

const (
	alertsFile    = "../deploy/prometheus/alerts.yml"
	dashboardFile = "../deploy/grafana/pgrelay.json"
)

// prometheusTool returns the path of a Prometheus binary (promtool or
// prometheus): missing, the test fails under CI (.ci/run installs Debian's
// prometheus package) and is skipped elsewhere.
func prometheusTool(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not installed under CI: install Debian's prometheus package (.ci/run does)", name)
		}
		t.Skipf("%s is not installed (Debian's prometheus package provides it); skipping", name)
	}
	return path
}

// TestAlertRulesPassPromtool checks deploy/prometheus/alerts.yml with
// Prometheus's own rule checker.
func TestAlertRulesPassPromtool(t *testing.T) {
	t.Parallel()
	promtool := prometheusTool(t, "promtool")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, promtool, "check", "rules", alertsFile).CombinedOutput()
	require.NoError(t, err, "promtool check rules %s:\n%s", alertsFile, out)
	require.Contains(t, string(out), "SUCCESS")
}

// metricName matches the names of pgrelay's own metrics in an expression.
var metricName = regexp.MustCompile(`\b(?:relay|consumer|inbox|outbox)_[a-z0-9_]+\b`)

// exportedNames reads the metric names a /metrics endpoint exports, with
// the histogram series' suffixes (_bucket, _sum, _count) as exported.
func exportedNames(t *testing.T, metricsURL string, into map[string]bool) {
	t.Helper()
	body := httpGet(t, metricsURL)
	for _, line := range strings.Split(body, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, _, _ := strings.Cut(line, " ")
		name, _, _ = strings.Cut(name, "{")
		into[name] = true
	}
}

func httpGet(t *testing.T, u string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", u, b)
	return string(b)
}

// promAPI queries a Prometheus HTTP API path and decodes its answer.
func promAPI(t *testing.T, base, path string, params url.Values, into any) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	u := base + path
	if params != nil {
		u += "?" + params.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, into); err != nil {
		return fmt.Errorf("%s: %w: %s", u, err, b)
	}
	return nil
}

// TestAlertRulesAndDashboardAgainstARealScrape runs a relay and a consumer
// as processes with their metrics endpoints, and Debian's Prometheus server
// scraping them every second with deploy/prometheus/alerts.yml loaded. Each
// rule's expression must evaluate (through /api/v1/query and in the rule
// evaluation itself) and name only metrics the services export; every
// expression of deploy/grafana/pgrelay.json must name only exported metrics
// too, and evaluate.
func TestAlertRulesAndDashboardAgainstARealScrape(t *testing.T) {
	t.Parallel()
	promBin := prometheusTool(t, "prometheus")
	dir := bins(t)
	dbURL := testdb.NewURL(t)
	natsURL := testnats.URL(t)
	stream, prefix := testnats.Stream(t, natsURL)

	relayAddr, consumerAddr, promAddr := freeAddr(t), freeAddr(t), freeAddr(t)
	startService(t, filepath.Join(dir, "relay"), []string{
		"DATABASE_URL=" + dbURL, "NATS_URL=" + natsURL, "RELAY_STREAM=" + stream, "RELAY_SUBJECT_PREFIX=" + prefix,
		"METRICS_ADDR=" + relayAddr, "ADMIN_ADDR=", "LOG_LEVEL=warn",
	}, "run")
	startService(t, filepath.Join(dir, "consumer"),
		consumerEnv(dbURL, natsURL, stream, prefix, "METRICS_ADDR="+consumerAddr, "CONSUMER_STATS_INTERVAL=1s", "LOG_LEVEL=warn"), "run")

	rules, err := filepath.Abs(alertsFile)
	require.NoError(t, err)
	tmp := t.TempDir()
	config := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
  - job_name: relay
    static_configs: [{targets: [%q]}]
  - job_name: consumer
    static_configs: [{targets: [%q]}]
`, rules, relayAddr, consumerAddr)
	configFile := filepath.Join(tmp, "prometheus.yml")
	require.NoError(t, os.WriteFile(configFile, []byte(config), 0o600))
	prom := startService(t, promBin, nil, "--config.file="+configFile, "--storage.tsdb.path="+filepath.Join(tmp, "data"),
		"--web.listen-address="+promAddr, "--log.level=warn")
	base := "http://" + promAddr

	// Both targets scraped and up.
	require.Eventually(t, func() bool {
		if !prom.running() {
			return false // its output is logged when the test fails
		}
		var r struct {
			Data struct {
				ActiveTargets []struct {
					Health string `json:"health"`
				} `json:"activeTargets"`
			} `json:"data"`
		}
		if promAPI(t, base, "/api/v1/targets", nil, &r) != nil || len(r.Data.ActiveTargets) != 2 {
			return false
		}
		for _, tg := range r.Data.ActiveTargets {
			if tg.Health != "up" {
				return false
			}
		}
		return true
	}, 60*time.Second, 200*time.Millisecond, "prometheus never saw the relay and the consumer up")

	exported := map[string]bool{}
	exportedNames(t, "http://"+relayAddr+"/metrics", exported)
	exportedNames(t, "http://"+consumerAddr+"/metrics", exported)
	var series struct {
		Status string   `json:"status"`
		Data   []string `json:"data"`
	}
	require.NoError(t, promAPI(t, base, "/api/v1/label/__name__/values", nil, &series))
	require.Equal(t, "success", series.Status)
	for _, n := range series.Data {
		exported[n] = true
	}

	// checkExpr evaluates expr once and requires every pgrelay metric it
	// names to be exported.
	checkExpr := func(where, expr string) {
		t.Helper()
		names := metricName.FindAllString(expr, -1)
		require.NotEmpty(t, names, "%s: names no pgrelay metric: %s", where, expr)
		for _, n := range names {
			require.True(t, exported[n], "%s: metric %s is not exported by the relay or the consumer (expr %s)", where, n, expr)
		}
		var r struct {
			Status string `json:"status"`
			Error  string `json:"error"`
		}
		require.NoError(t, promAPI(t, base, "/api/v1/query", url.Values{"query": {expr}}, &r))
		require.Equal(t, "success", r.Status, "%s: %s: %s", where, expr, r.Error)
	}

	// The rules as Prometheus loaded them, each evaluated by the server too.
	type rule struct {
		Name      string `json:"name"`
		Query     string `json:"query"`
		Health    string `json:"health"`
		LastError string `json:"lastError"`
	}
	var loaded []rule
	require.Eventually(t, func() bool {
		var r struct {
			Data struct {
				Groups []struct {
					Rules []rule `json:"rules"`
				} `json:"groups"`
			} `json:"data"`
		}
		if promAPI(t, base, "/api/v1/rules", nil, &r) != nil {
			return false
		}
		loaded = loaded[:0]
		for _, g := range r.Data.Groups {
			for _, ru := range g.Rules {
				if ru.Health == "unknown" {
					return false // not evaluated yet
				}
				loaded = append(loaded, ru)
			}
		}
		return len(loaded) > 0
	}, 30*time.Second, 200*time.Millisecond, "prometheus never evaluated the rules")
	rulesText, err := os.ReadFile(alertsFile)
	require.NoError(t, err)
	require.Len(t, loaded, strings.Count(string(rulesText), "- alert:"), "every rule in %s loaded", alertsFile)
	for _, ru := range loaded {
		require.Equal(t, "ok", ru.Health, "rule %s: %s", ru.Name, ru.LastError)
		checkExpr("rule "+ru.Name, ru.Query)
	}

	// The dashboard: valid JSON, every expr names exported metrics and
	// evaluates.
	raw, err := os.ReadFile(dashboardFile)
	require.NoError(t, err)
	var dash any
	require.NoError(t, json.Unmarshal(raw, &dash), dashboardFile)
	var exprs []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if s, ok := x.(string); ok && k == "expr" {
					exprs = append(exprs, s)
				}
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(dash)
	require.NotEmpty(t, exprs, "%s has no expr", dashboardFile)
	for _, e := range exprs {
		checkExpr(dashboardFile, e)
	}
}

// TestAlertWALGapFires runs promtool's rule unit test on PgrelayWALGap: it
// fires as soon as a relay reports relay_wal_gap 1, and not before.
func TestAlertWALGapFires(t *testing.T) {
	t.Parallel()
	promtool := prometheusTool(t, "promtool")
	rules, err := filepath.Abs(alertsFile)
	require.NoError(t, err)
	spec := filepath.Join(t.TempDir(), "wal_gap_test.yml")
	require.NoError(t, os.WriteFile(spec, []byte(`rule_files: [`+rules+`]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'relay_wal_gap{job="relay", instance="r1", database="orders"}'
        values: '0 0 1 1'
    alert_rule_test:
      - eval_time: 1m
        alertname: PgrelayWALGap
        exp_alerts: []
      - eval_time: 2m
        alertname: PgrelayWALGap
        exp_alerts:
          - exp_labels: {severity: critical, job: relay, instance: r1, database: orders}
            exp_annotations:
              summary: "r1: WAL capture stopped at a gap"
              description: "The relay's error log names the events read from no slot (LSN range, time); re-emit them and run relay wal accept-gap (docs/wal.md#failover)."
`), 0o600))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, promtool, "test", "rules", spec).CombinedOutput()
	require.NoError(t, err, "promtool test rules:\n%s", out)
}
