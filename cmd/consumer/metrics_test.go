package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	pgnats "github.com/pgrelay/pgrelay/broker/nats"
	"github.com/pgrelay/pgrelay/internal/admin"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/internal/testnats"
)

// freeAddr returns a loopback address with a port free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// counter reads one unlabelled series from a Prometheus text endpoint.
func counter(t *testing.T, metricsURL, name string) float64 {
	t.Helper()
	resp, err := http.Get(metricsURL)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			require.NoError(t, err, line)
			return f
		}
	}
	t.Fatalf("%s not exported", name)
	return 0
}

// TestIngestCountersAndHitRateFromTheRealPath runs the consumer as its binary
// does, delivers four events and two redeliveries of them under new broker
// ids through JetStream, and reads the delivery counters and the dedup hit
// rate where operators read them: /metrics, the admin API's /v1/stats and
// `consumer stats --metrics-url`. Nothing feeds the counters but the ingest
// path itself.
func TestIngestCountersAndHitRateFromTheRealPath(t *testing.T) {
	dbURL := testdb.NewURL(t)
	natsURL := testnats.URL(t)
	stream, prefix := testnats.Stream(t, natsURL)
	metricsAddr, adminAddr := freeAddr(t), freeAddr(t)
	metricsURL := "http://" + metricsAddr + "/metrics"

	startConsumerCommand(t, "run", "--database-url", dbURL, "--nats-url", natsURL, "--stream", stream,
		"--subject-prefix", prefix, "--durable", "metrics-test", "--metrics-addr", metricsAddr,
		"--admin-addr", adminAddr, "--log-level", "error", "--max-wait", "100ms")

	_, js := testnats.Connect(t, natsURL)
	publish := func(eventID, msgID string) {
		m := nats.NewMsg(prefix + ".orders")
		m.Header.Set(pgnats.MsgIDHeader, msgID)
		m.Header.Set(event.HeaderEventID, eventID)
		m.Header.Set(event.HeaderEventType, "Unknown") // the handler dead-letters it; ingest is what counts here
		m.Data = []byte(`{}`)
		pctx, pcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer pcancel()
		_, err := js.PublishMsg(pctx, m)
		require.NoError(t, err)
	}
	for i := range 4 {
		publish(fmt.Sprintf("e-%d", i), fmt.Sprintf("m-%d", i))
	}
	publish("e-0", "m-0-again") // redeliveries the broker cannot drop: new broker ids
	publish("e-1", "m-1-again")

	require.Eventually(t, func() bool {
		resp, err := http.Get(metricsURL)
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		// Deliveries are counted when fetched, duplicates once stored.
		return counter(t, metricsURL, "consumer_received_total") == 6 &&
			counter(t, metricsURL, "consumer_dedup_total") == 2
	}, 30*time.Second, 50*time.Millisecond, "the consumer's /metrics never counted 6 deliveries of which 2 duplicates")

	// The admin API, in process.
	resp, err := http.Get("http://" + adminAddr + "/v1/stats")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var st admin.Stats
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&st))
	require.NotNil(t, st.Dedup, "the admin API reports the hit rate")
	require.Equal(t, 6.0, st.Dedup.Received)
	require.Equal(t, 2.0, st.Dedup.Duplicates)
	require.InDelta(t, 2.0/6, st.Dedup.HitRate, 1e-9)

	// The CLI, scraping the running consumer.
	var out bytes.Buffer
	cmd := newRootCommand()
	cmd.SetArgs([]string{"stats", "--database-url", dbURL, "--metrics-url", metricsURL, "--json"})
	cmd.SetOut(&out)
	cmd.SetErr(io.Discard)
	require.NoError(t, cmd.Execute())
	var cliStats admin.Stats
	require.NoError(t, json.Unmarshal(out.Bytes(), &cliStats), out.String())
	require.NotNil(t, cliStats.Dedup)
	require.InDelta(t, 2.0/6, cliStats.Dedup.HitRate, 1e-9)
	require.Equal(t, int64(4), cliStats.Inbox.ByStatus["pending"]+cliStats.Inbox.ByStatus["processing"]+
		cliStats.Inbox.ByStatus["processed"]+cliStats.Inbox.ByStatus["dead"], "four distinct events stored")
}

// TestDedupHitRatioAndReceiveHistogramFromTheRealPath runs the consumer as its
// binary does with a short stats interval, delivers two events and then a
// redelivery of each under new broker ids, and reads the hit-ratio gauge
// (consumer_dedup_hit_ratio, 1 over the interval made of duplicates only) and
// the Receive latency histogram (consumer_receive_duration_seconds) from
// /metrics.
func TestDedupHitRatioAndReceiveHistogramFromTheRealPath(t *testing.T) {
	dbURL := testdb.NewURL(t)
	natsURL := testnats.URL(t)
	stream, prefix := testnats.Stream(t, natsURL)
	metricsAddr := freeAddr(t)
	metricsURL := "http://" + metricsAddr + "/metrics"

	startConsumerCommand(t, "run", "--database-url", dbURL, "--nats-url", natsURL, "--stream", stream,
		"--subject-prefix", prefix, "--durable", "ratio-test", "--metrics-addr", metricsAddr,
		"--admin-addr", "", "--log-level", "error", "--max-wait", "100ms", "--stats-interval", "100ms")
	up := func() bool {
		resp, err := http.Get(metricsURL)
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return true
	}
	require.Eventually(t, up, 30*time.Second, 50*time.Millisecond)

	_, js := testnats.Connect(t, natsURL)
	publish := func(eventID, msgID string) {
		m := nats.NewMsg(prefix + ".orders")
		m.Header.Set(pgnats.MsgIDHeader, msgID)
		m.Header.Set(event.HeaderEventID, eventID)
		m.Header.Set(event.HeaderEventType, "Unknown")
		m.Data = []byte(`{}`)
		pctx, pcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer pcancel()
		_, err := js.PublishMsg(pctx, m)
		require.NoError(t, err)
	}
	publish("e-0", "m-0")
	publish("e-1", "m-1")
	require.Eventually(t, func() bool {
		return counter(t, metricsURL, "consumer_received_total") == 2 &&
			counter(t, metricsURL, "consumer_receive_duration_seconds_count") >= 1
	}, 30*time.Second, 50*time.Millisecond, "the Receive statement was not timed")
	time.Sleep(300 * time.Millisecond) // an interval for the redeliveries alone
	publish("e-0", "m-0-again")
	publish("e-1", "m-1-again")
	require.Eventually(t, func() bool {
		return counter(t, metricsURL, "consumer_dedup_hit_ratio") == 1
	}, 30*time.Second, 20*time.Millisecond, "consumer_dedup_hit_ratio never showed the all-duplicates interval")
	time.Sleep(300 * time.Millisecond) // quiet intervals keep the last ratio
	require.Equal(t, 1.0, counter(t, metricsURL, "consumer_dedup_hit_ratio"))
	require.GreaterOrEqual(t, counter(t, metricsURL, "consumer_receive_duration_seconds_count"), 2.0)
}
