// Package metrics exports pgrelay's Prometheus metrics and health endpoints.
//
// Each service builds its own registry (NewRegistry; the global default
// registry is never used) and registers the collectors it needs: an
// InboxObserver (the inbox.Observer of the consumer's workers), a
// RelayObserver (the relay.Observer), ingest counters read from the consumer,
// and DB-derived gauges (InboxCollector, OutboxCollector) that query the
// database with a timeout and cache the result for a few seconds. Every series
// exists from start-up with the value zero, including every label value of
// the bounded reason labels, so that rate() and alerts work before the first
// event. Server serves /metrics, /livez (/healthz) and /readyz.
//
// Metric names and help texts are listed in docs/architecture.md
// ("Operations").
package metrics

import (
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// NewRegistry returns a registry with the Go runtime and process collectors.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return reg
}

// latencyBuckets spans 1 ms to about 65 s: handler and publish latencies.
var latencyBuckets = prometheus.ExponentialBuckets(0.001, 2, 17)

// lagBuckets spans 5 ms to about 45 min: commit-to-ack lag, which includes
// any outage of the broker or the relay.
var lagBuckets = prometheus.ExponentialBuckets(0.005, 2.5, 16)

// Retry reasons (the reason label of consumer_retries_total). A handler error
// message is free text, so it is classified into this bounded set.
const (
	RetryError   = "error"
	RetryTimeout = "timeout"
	RetryPanic   = "panic"
)

// Dead-letter reasons (the reason label of consumer_dlq_total).
const (
	DeadPermanent          = "permanent"
	DeadAttemptsExhausted  = "attempts_exhausted"
	DeadWorkerLost         = "worker_lost"
	DeadDeferralsExhausted = "deferrals_exhausted"
	DeadExpired            = "expired"
	DeadOther              = "other"
)

// RetryReasons and DeadReasons list every value the reason labels take.
var (
	RetryReasons = []string{RetryError, RetryTimeout, RetryPanic}
	DeadReasons  = []string{DeadPermanent, DeadAttemptsExhausted, DeadWorkerLost, DeadDeferralsExhausted, DeadExpired, DeadOther}
)

// ClassifyRetry maps a retried event's recorded error onto a retry reason.
func ClassifyRetry(reason string) string {
	switch {
	case strings.HasPrefix(reason, "handler panicked"):
		return RetryPanic
	case strings.HasPrefix(reason, "handler timed out"), strings.Contains(reason, "context deadline exceeded"):
		return RetryTimeout
	default:
		return RetryError
	}
}

// ClassifyDead maps a dead event's recorded reason onto a dead-letter reason.
func ClassifyDead(reason string) string {
	switch {
	case strings.HasPrefix(reason, "permanent"):
		return DeadPermanent
	case strings.HasPrefix(reason, "attempts exhausted") && strings.Contains(reason, "worker lost"):
		return DeadWorkerLost
	case strings.HasPrefix(reason, "attempts exhausted"):
		return DeadAttemptsExhausted
	case strings.HasPrefix(reason, "deferrals exhausted"):
		return DeadDeferralsExhausted
	case strings.HasPrefix(reason, "expired"):
		return DeadExpired
	default:
		return DeadOther
	}
}

func seconds(d time.Duration) float64 { return d.Seconds() }
