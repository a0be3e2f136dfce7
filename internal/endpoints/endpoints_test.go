package endpoints_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/cli"
	"github.com/pgrelay/pgrelay/internal/endpoints"
	"github.com/pgrelay/pgrelay/internal/metrics"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// TestOpsServeAndStop: StartOps serves metrics (with the DB gauges),
// readiness and the admin API, and stops when its context is cancelled.
func TestOpsServeAndStop(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	var f endpoints.Flags
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	cli.Bind(fs, cli.EndpointOptions(&f, "127.0.0.1:0", "127.0.0.1:0", true))
	require.NoError(t, fs.Parse(nil))
	require.Equal(t, 7*24*time.Hour, f.DedupWindow)

	ctx, cancel := context.WithCancel(context.Background())
	ops, err := endpoints.Start(ctx, endpoints.Config{Flags: f, Pool: pool, Registry: metrics.NewRegistry(), Inbox: true, Outbox: true,
		Checks: map[string]metrics.Check{"database": metrics.PingCheck(pool)}})
	require.NoError(t, err)

	base := "http://" + ops.MetricsAddr().String()
	code, body := get(t, base+"/metrics")
	require.Equal(t, http.StatusOK, code)
	for _, name := range []string{"inbox_pending_rows", "outbox_pending_rows"} {
		require.Contains(t, body, "\n"+name+" ", name)
	}
	code, _ = get(t, base+"/readyz")
	require.Equal(t, http.StatusOK, code)
	code, body = get(t, "http://"+ops.AdminAddr().String()+"/v1/stats")
	require.Equal(t, http.StatusOK, code, body)
	// One database, named after its database name: named or not, it answers.
	name := pool.Config().ConnConfig.Database
	code, body = get(t, "http://"+ops.AdminAddr().String()+"/v1/databases")
	require.Equal(t, http.StatusOK, code, body)
	var listed []struct {
		Name    string `json:"name"`
		Default bool   `json:"default"`
		Schema  struct {
			Version, Latest int64
			Pending         []int64
		} `json:"schema"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &listed), body)
	require.Len(t, listed, 1, body)
	require.Equal(t, name, listed[0].Name)
	require.True(t, listed[0].Default)
	require.Positive(t, listed[0].Schema.Latest, body)
	require.Equal(t, listed[0].Schema.Latest, listed[0].Schema.Version, "a fully migrated database: at the latest version")
	require.Equal(t, []int64{}, listed[0].Schema.Pending, body)
	code, body = get(t, "http://"+ops.AdminAddr().String()+"/v1/stats?database="+name)
	require.Equal(t, http.StatusOK, code, body)
	code, body = get(t, "http://"+ops.AdminAddr().String()+"/v1/stats?database=other")
	require.Equal(t, http.StatusNotFound, code, body)
	require.Contains(t, body, "(databases: "+name+")")
	// The web console is served on the same address (/ leads to it).
	code, body = get(t, "http://"+ops.AdminAddr().String()+"/")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "<h1>Overview</h1>")

	cancel()
	done := make(chan error, 1)
	go func() { done <- ops.Wait() }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(15 * time.Second):
		t.Fatal("ops did not stop")
	}
}

// TestOpsRefuseBadSettings: an admin API off loopback without a token and a
// busy address fail at start-up, naming the setting.
func TestOpsRefuseBadSettings(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, err := endpoints.Start(ctx, endpoints.Config{Flags: endpoints.Flags{AdminAddr: "0.0.0.0:0"}, Pool: pool, Registry: metrics.NewRegistry()})
	require.ErrorContains(t, err, "--admin-token")

	ops, err := endpoints.Start(ctx, endpoints.Config{Flags: endpoints.Flags{MetricsAddr: "127.0.0.1:0"}, Pool: pool, Registry: metrics.NewRegistry()})
	require.NoError(t, err)
	_, err = endpoints.Start(ctx, endpoints.Config{Flags: endpoints.Flags{MetricsAddr: ops.MetricsAddr().String()}, Pool: pool, Registry: metrics.NewRegistry()})
	require.ErrorContains(t, err, "--metrics-addr")
	cancel()
	require.NoError(t, ops.Wait())
}
