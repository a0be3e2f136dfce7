package relay_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/broker/nats"
	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/internal/testnats"
	"github.com/pgrelay/pgrelay/relay"
)

// TestMetricsFollowTheRealRelay runs the relay against JetStream and reads
// its /metrics over HTTP until the published counter, the lag histogram, the
// lease counters and the outbox gauges say what happened.
func TestMetricsFollowTheRealRelay(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	natsURL := testnats.URL(t)
	stream, prefix := testnats.Stream(t, natsURL)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pub, err := nats.NewPublisher(ctx, nats.Config{URL: natsURL, SubjectPrefix: prefix, Stream: stream})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })

	for i := range 5 {
		_, err := pool.Exec(ctx, `INSERT INTO pgrelay.outbox (event_id, topic, key, event_type) VALUES ($1, 'orders', $2, 'OrderPaid')`,
			fmt.Sprintf("evt-%d", i), fmt.Sprintf("order-%d", i%2))
		require.NoError(t, err)
	}
	r, err := relay.New(relay.Config{Pool: pool, Publisher: pub, MetricsAddr: "127.0.0.1:0",
		PollInterval: 20 * time.Millisecond, Lease: 3 * time.Second})
	require.NoError(t, err)
	rctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	t.Cleanup(func() { stop(); <-done })
	require.Eventually(t, func() bool { return r.MetricsAddr() != nil }, 10*time.Second, 10*time.Millisecond)

	// Every series carries the database's label: Pool's database name.
	label := fmt.Sprintf(`{database=%q}`, pool.Config().ConnConfig.Database)
	var m map[string]float64
	require.Eventually(t, func() bool {
		m = scrape(t, "http://"+r.MetricsAddr().String()+"/metrics")
		return m["relay_published_total"+label] == 5 && m["outbox_pending_rows"+label] == 0
	}, 20*time.Second, 20*time.Millisecond, "the relay never published the 5 rows")
	require.GreaterOrEqual(t, m["relay_outbox_lag_seconds_count"+label], 1.0)
	require.GreaterOrEqual(t, m["relay_publish_duration_seconds_count"+label], 1.0)
	require.Positive(t, m["relay_lease_acquired_total"+label])
	require.Zero(t, m["relay_publish_duplicates_total"+label])
	require.Zero(t, m["relay_fenced_total"+label])
	require.Zero(t, m["outbox_oldest_pending_age_seconds"+label])
}

// scrape reads the series of a /metrics page.
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		require.Positive(t, i, line)
		v, err := strconv.ParseFloat(line[i+1:], 64)
		require.NoError(t, err, line)
		out[line[:i]] = v
	}
	require.NoError(t, sc.Err())
	return out
}
