package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// RelayObserver is the relay's observer, with Prometheus collectors; the
// relay package passes it to its engine.
type RelayObserver struct {
	published     prometheus.Counter
	duplicates    prometheus.Counter
	publishErrors prometheus.Counter
	failedEvents  prometheus.Counter
	dead          prometheus.Counter
	expired       prometheus.Counter
	fenced        prometheus.Counter
	acquired      prometheus.Counter
	takeovers     prometheus.Counter
	lost          prometheus.Counter
	held          prometheus.Gauge
	lag           prometheus.Histogram
	publishTime   prometheus.Histogram

	waitMu sync.Mutex
	waits  map[int]time.Time // partitions waiting for standbys, since when
}

// NewRelayObserver registers the relay's metrics on reg and returns the
// observer that drives them.
func NewRelayObserver(reg prometheus.Registerer) *RelayObserver {
	o := &RelayObserver{
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "relay_published_total",
			Help: "Outbox events acknowledged by the broker and marked published.",
		}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "relay_publish_duplicates_total",
			Help: "Published events the broker reported as duplicates of an earlier publish (a republish after a crash or a fenced mark).",
		}),
		publishErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "relay_publish_errors_total",
			Help: "Transient publish failures (each backs its partition off; the events stay pending).",
		}),
		failedEvents: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "relay_publish_failed_events_total",
			Help: "Events left pending by transient publish failures (counted once per failure).",
		}),
		dead: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "relay_dead_total",
			Help: "Outbox events rejected permanently by the broker and marked dead.",
		}),
		expired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "relay_expired_total",
			Help: "Outbox events whose expires_at passed before they were published, marked dead with the reason expired.",
		}),
		fenced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "relay_fenced_total",
			Help: "Marks refused because another relay took the partition over (its epoch moved on).",
		}),
		acquired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "relay_lease_acquired_total",
			Help: "Partition leases acquired by this relay.",
		}),
		takeovers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "relay_lease_takeovers_total",
			Help: "Partition leases taken from a relay whose lease had expired.",
		}),
		lost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "relay_lease_lost_total",
			Help: "Partitions this relay found owned by another relay.",
		}),
		held: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "relay_partitions_held",
			Help: "Outbox partitions this relay holds and works, as of its last heartbeat.",
		}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "relay_outbox_lag_seconds",
			Help:    "Time from an outbox row's commit to its broker acknowledgement (the oldest row of each published batch).",
			Buckets: lagBuckets,
		}),
		publishTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "relay_publish_duration_seconds",
			Help:    "Time to publish one batch to the broker, from the first send to the last acknowledgement or failure.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
	}
	o.waits = map[int]time.Time{}
	wait := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "relay_standby_wait_seconds",
		Help: "How long the oldest batch held for the standbys of --standby-names has waited; 0 when none waits.",
	}, o.longestWait)
	reg.MustRegister(o.published, o.duplicates, o.publishErrors, o.failedEvents, o.dead, o.expired, o.fenced,
		o.acquired, o.takeovers, o.lost, o.held, o.lag, o.publishTime, wait)
	return o
}

// StandbyWait records that a partition's batch waits for the standbys since
// since, or no longer waits (since zero).
func (o *RelayObserver) StandbyWait(partition int, since time.Time) {
	o.waitMu.Lock()
	defer o.waitMu.Unlock()
	if since.IsZero() {
		delete(o.waits, partition)
	} else {
		o.waits[partition] = since
	}
}

func (o *RelayObserver) longestWait() float64 {
	o.waitMu.Lock()
	defer o.waitMu.Unlock()
	var longest time.Duration
	for _, since := range o.waits {
		longest = max(longest, time.Since(since))
	}
	return seconds(longest)
}

// Published counts published events and observes the batch's lag.
func (o *RelayObserver) Published(_ int, n, duplicates int, lag time.Duration) {
	o.published.Add(float64(n))
	o.duplicates.Add(float64(duplicates))
	if n > 0 {
		o.lag.Observe(seconds(lag))
	}
}

// PublishDuration observes how long a batch took to publish.
func (o *RelayObserver) PublishDuration(_ int, _ int, d time.Duration) {
	o.publishTime.Observe(seconds(d))
}

// PublishFailed counts a transient failure.
func (o *RelayObserver) PublishFailed(_ int, n int, _ error) {
	o.publishErrors.Inc()
	o.failedEvents.Add(float64(n))
}

// MarkedDead counts events marked dead.
func (o *RelayObserver) MarkedDead(_ int, n int) { o.dead.Add(float64(n)) }

// Expired counts events marked dead because they expired unpublished.
func (o *RelayObserver) Expired(_ int, n int) { o.expired.Add(float64(n)) }

// Fenced counts a refused mark.
func (o *RelayObserver) Fenced(int) { o.fenced.Inc() }

// LeaseAcquired counts an acquired lease, and a takeover when it was one.
func (o *RelayObserver) LeaseAcquired(_ int, _ int64, takenOver bool) {
	o.acquired.Inc()
	if takenOver {
		o.takeovers.Inc()
	}
}

// LeaseLost counts a lost partition.
func (o *RelayObserver) LeaseLost(int) { o.lost.Inc() }

// PartitionsHeld sets the partitions-held gauge.
func (o *RelayObserver) PartitionsHeld(n int) { o.held.Set(float64(n)) }

// RelaySchema is a database's schema version as the relay last read it.
type RelaySchema struct {
	version, pending prometheus.Gauge
}

// NewRelaySchema registers the schema gauges on reg.
func NewRelaySchema(reg prometheus.Registerer) *RelaySchema {
	s := &RelaySchema{
		version: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "relay_schema_version",
			Help: "The highest pgrelay migration applied to the database, as the relay last read it (at start, then each minute).",
		}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "relay_schema_pending_migrations",
			Help: "The relay's embedded migrations the database has not applied: above 0, the database is behind but within the relay's supported range.",
		}),
	}
	reg.MustRegister(s.version, s.pending)
	return s
}

// Set records the schema's version and its pending migrations.
func (s *RelaySchema) Set(version int64, pending int) {
	s.version.Set(float64(version))
	s.pending.Set(float64(pending))
}
