package main

import (
	"github.com/spf13/cobra"

	"github.com/pgrelay/pgrelay/internal/cli"
	"github.com/pgrelay/pgrelay/internal/metrics"
)

// healthCommand probes a running relay's /readyz, for container health checks
// in images without a shell or curl.
func healthCommand() *cobra.Command {
	var probeAddr string
	health := &cobra.Command{
		Use:   "healthcheck",
		Short: "Exit 0 when the relay serving --metrics-addr is ready (for container health checks)",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return metrics.ProbeReady(cmd.Context(), probeAddr) },
	}
	health.Flags().StringVar(&probeAddr, "metrics-addr", cli.EnvString("METRICS_ADDR", defaultMetricsAddr), "the relay's --metrics-addr (METRICS_ADDR)")
	return health
}
