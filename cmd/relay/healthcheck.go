package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgrelay/pgrelay/internal/cli"
)

// healthCommand probes a running relay's /readyz, for container health checks
// in images without a shell or curl.
func healthCommand() *cobra.Command {
	var probeAddr string
	health := &cobra.Command{
		Use:   "healthcheck",
		Short: "Exit 0 when the relay serving --metrics-addr is ready (for container health checks)",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return healthcheck(cmd.Context(), probeAddr) },
	}
	health.Flags().StringVar(&probeAddr, "metrics-addr", cli.EnvString("METRICS_ADDR", ":9090"), "the relay's --metrics-addr (METRICS_ADDR)")
	return health
}

// healthcheck returns nil when GET /readyz on addr answers 200 within 3s.
func healthcheck(ctx context.Context, addr string) error {
	if addr == "" {
		return errors.New("--metrics-addr (METRICS_ADDR) is empty: nothing to probe")
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--metrics-addr (METRICS_ADDR) %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1" // a listener on all interfaces is probed on loopback
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
