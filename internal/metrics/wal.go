package metrics

import "github.com/prometheus/client_golang/prometheus"

// walStatuses are pg_replication_slots.wal_status's values, each a series of
// relay_wal_slot_status (1 for the current one).
var walStatuses = []string{"reserved", "extended", "unreserved", "lost"}

// WALObserver is the relay's WAL observer, with Prometheus gauges: the slot
// lag in bytes and seconds, its wal_status, and whether this relay streams
// it.
type WALObserver struct {
	lagBytes, lagSeconds, reading, capture, gap prometheus.Gauge
	status                                      *prometheus.GaugeVec
	rejected                                    *prometheus.CounterVec
}

// walRejectReasons are relay_wal_rejected_total's reasons
// (relay.WALObserver.WALRejected).
var walRejectReasons = []string{"unsigned", "unknown_key", "bad_signature"}

// NewWALObserver registers the WAL capture's metrics on reg. A relay
// registers them whatever its capture, so that dashboards and alert rules
// find them; they stay 0 on a table relay.
func NewWALObserver(reg prometheus.Registerer) *WALObserver {
	o := &WALObserver{
		lagBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "relay_wal_slot_lag_bytes",
			Help: "WAL the replication slot holds back: the server's current position less the slot's confirmed position.",
		}),
		lagSeconds: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "relay_wal_slot_lag_seconds",
			Help: "Age of the oldest committed event this relay read from the slot and has not confirmed yet (0 when none, or on a standby).",
		}),
		capture: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "relay_wal_capture",
			Help: "1 when this relay captures from the WAL (--capture wal; it holds no outbox partition), 0 for a table relay.",
		}),
		reading: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "relay_wal_slot_reading",
			Help: "1 when this relay streams the replication slot, 0 when it waits as a standby.",
		}),
		gap: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "relay_wal_gap",
			Help: "1 while the WAL capture streams nothing because its slot has a gap no operator accepted (a failover or a dropped slot; docs/wal.md#failover).",
		}),
		status: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "relay_wal_slot_status",
			Help: "The replication slot's wal_status: 1 for the current one (reserved, extended, unreserved, lost).",
		}, []string{"wal_status"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "relay_wal_rejected_total",
			Help: "Messages with pgrelay's prefix skipped, never published, because no allowed producer signed them (reason: unsigned, unknown_key, bad_signature; docs/wal.md#who-can-publish).",
		}, []string{"reason"}),
	}
	for _, st := range walStatuses {
		o.status.WithLabelValues(st) // every series exported, at 0, from the start
	}
	for _, r := range walRejectReasons {
		o.rejected.WithLabelValues(r)
	}
	reg.MustRegister(o.lagBytes, o.lagSeconds, o.reading, o.capture, o.gap, o.status, o.rejected)
	return o
}

// WALRejected implements the relay's WAL observer.
func (o *WALObserver) WALRejected(reason string) { o.rejected.WithLabelValues(reason).Inc() }

// WALSlot implements the relay's WAL observer: the slot's status as of a
// heartbeat (relay.WALSlotStatus).
func (o *WALObserver) WALSlot(lagBytes int64, lagSeconds float64, reading bool, walStatus string, gap bool) {
	o.capture.Set(1)
	o.lagBytes.Set(float64(lagBytes))
	o.lagSeconds.Set(lagSeconds)
	o.reading.Set(one(reading))
	o.gap.Set(one(gap))
	for _, st := range walStatuses {
		v := 0.0
		if st == walStatus {
			v = 1
		}
		o.status.WithLabelValues(st).Set(v)
	}
}

// one is 1 for true, 0 for false.
func one(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
