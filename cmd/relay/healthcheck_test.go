package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestHealthcheckProbesReadyz(t *testing.T) {
	t.Parallel()
	var ready atomic.Bool
	ready.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" || !ready.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(srv.Close)
	addr := strings.TrimPrefix(srv.URL, "http://")

	require.NoError(t, execute(context.Background(), "healthcheck", "--metrics-addr", addr))
	ready.Store(false)
	require.ErrorContains(t, execute(context.Background(), "healthcheck", "--metrics-addr", addr), "unhealthy: 503")
	require.ErrorContains(t, execute(context.Background(), "healthcheck", "--metrics-addr", ""), "--metrics-addr (METRICS_ADDR)")
}
