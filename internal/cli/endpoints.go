package cli

import (
	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/endpoints"
)

// EndpointOptions are --metrics-addr, --admin-addr and --admin-token (and,
// when withRetention is set, the inbox retention's --dedup-window and
// --dedup-record-max), stored in f, filling the services' Config fields of
// the same names (Inbox.Retention.Window and .DuplicatesMax).
func EndpointOptions(f *endpoints.Flags, metricsAddr, adminAddr string, withRetention bool) Options {
	opts := Options{
		{"metrics-addr", "METRICS_ADDR", "MetricsAddr", &f.MetricsAddr, metricsAddr, "address serving /metrics, /livez (also /healthz) and /readyz; empty disables"},
		{"admin-addr", "ADMIN_ADDR", "AdminAddr", &f.AdminAddr, adminAddr, "address of the admin API (loopback unless --admin-token is set); empty disables"},
		{"admin-token", "ADMIN_TOKEN", "AdminToken", &f.AdminToken, "", "bearer token the admin API requires; required off loopback"},
	}
	if withRetention {
		opts = append(opts,
			Option{"dedup-window", "DEDUP_WINDOW", "Inbox.Retention.Window", &f.DedupWindow, pgrelay.DefaultDedupWindow, "how long processed inbox rows are kept to absorb redeliveries; must exceed the broker's redelivery horizon"},
			Option{"dedup-record-max", "DEDUP_RECORD_MAX", "Inbox.Retention.DuplicatesMax", &f.DedupRecordMax, pgrelay.DefaultDuplicatesMax, "how many recorded duplicates (the console's feed, inbox_duplicates) inbox retention keeps; at least 1"})
	}
	return opts
}
