package metrics

import "github.com/prometheus/client_golang/prometheus"

// RetentionObserver implements inbox.RetentionObserver with Prometheus
// counters.
type RetentionObserver struct {
	deleted  prometheus.Counter
	failures prometheus.Counter
}

// NewRetentionObserver registers the inbox retention metrics on reg.
func NewRetentionObserver(reg prometheus.Registerer) *RetentionObserver {
	o := &RetentionObserver{
		deleted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "inbox_retention_deleted_total",
			Help: "Processed inbox rows deleted after their dedup window.",
		}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "inbox_retention_failures_total",
			Help: "Inbox retention runs that failed (retried at the next interval).",
		}),
	}
	reg.MustRegister(o.deleted, o.failures)
	return o
}

// Deleted counts deleted rows.
func (o *RetentionObserver) Deleted(n int64) { o.deleted.Add(float64(n)) }

// Failed counts a failed run.
func (o *RetentionObserver) Failed(error) { o.failures.Inc() }
