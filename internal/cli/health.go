package cli

import (
	"github.com/spf13/cobra"

	"github.com/pgrelay/pgrelay/internal/endpoints"
	"github.com/pgrelay/pgrelay/internal/metrics"
)

// HealthCommand probes a running service's /readyz (service: relay or
// consumer, serving metricsAddr by default), for container health checks in
// images without a shell or curl.
func HealthCommand(service, metricsAddr string) *cobra.Command {
	var probeAddr string
	health := &cobra.Command{
		Use:   "healthcheck",
		Short: "Exit 0 when the " + service + " serving --metrics-addr is ready (for container health checks)",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return metrics.ProbeReady(cmd.Context(), probeAddr) },
	}
	probe := EndpointOptions(&endpoints.Flags{}, metricsAddr, "", false)[:1]
	probe[0].Ptr, probe[0].Usage = &probeAddr, "the "+service+"'s --metrics-addr"
	Bind(health.Flags(), probe)
	return health
}
