package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// ProbeReady returns nil when GET /readyz on addr (a service's
// --metrics-addr) answers 200 within 3 s. A listener on all interfaces is
// probed on loopback. It is what the services' healthcheck subcommands run,
// for container health checks in images without a shell or curl.
func ProbeReady(ctx context.Context, addr string) error {
	if addr == "" {
		return errors.New("--metrics-addr (METRICS_ADDR) is empty: nothing to probe")
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--metrics-addr (METRICS_ADDR) %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(host, port)+"/readyz", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("unhealthy: %s", resp.Status)
	}
	return nil
}
