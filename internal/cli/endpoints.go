package cli

import (
	"github.com/spf13/pflag"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/endpoints"
)

// BindEndpointFlags registers --metrics-addr, --admin-addr and --admin-token (and,
// when withRetention is set, --dedup-window and --dedup-record-max) on fs,
// defaulted from METRICS_ADDR, ADMIN_ADDR, ADMIN_TOKEN, DEDUP_WINDOW and
// DEDUP_RECORD_MAX.
func BindEndpointFlags(fs *pflag.FlagSet, f *endpoints.Flags, metricsAddr, adminAddr string, withRetention bool) {
	fs.StringVar(&f.MetricsAddr, "metrics-addr", EnvString("METRICS_ADDR", metricsAddr), "address serving /metrics, /healthz and /readyz; empty disables (METRICS_ADDR)")
	fs.StringVar(&f.AdminAddr, "admin-addr", EnvString("ADMIN_ADDR", adminAddr), "address of the admin API (loopback unless --admin-token is set); empty disables (ADMIN_ADDR)")
	fs.StringVar(&f.AdminToken, "admin-token", EnvString("ADMIN_TOKEN", ""), "bearer token the admin API requires; required off loopback (ADMIN_TOKEN)")
	if withRetention {
		fs.DurationVar(&f.DedupWindow, "dedup-window", EnvDuration("DEDUP_WINDOW", pgrelay.DefaultDedupWindow), "how long processed inbox rows are kept to absorb redeliveries; must exceed the broker's redelivery horizon (DEDUP_WINDOW)")
		fs.IntVar(&f.DedupRecordMax, "dedup-record-max", EnvInt("DEDUP_RECORD_MAX", pgrelay.DefaultDuplicatesMax), "how many recorded duplicates (the console's feed, inbox_duplicates) inbox retention keeps; at least 1 (DEDUP_RECORD_MAX)")
	}
}

// EndpointEnvKinds lists the typed environment variables of
// BindEndpointFlags, for ValidateEnv.
var EndpointEnvKinds = map[string]string{"DEDUP_WINDOW": "duration", "DEDUP_RECORD_MAX": "int"}
