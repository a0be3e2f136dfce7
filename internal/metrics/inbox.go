package metrics

import (
	"time"

	"github.com/pgrelay/pgrelay"
	"github.com/prometheus/client_golang/prometheus"
)

// InboxObserver implements pgrelay.InboxObserver with Prometheus collectors. Pass it
// as pgrelay.InboxConfig.Observer (consumer.Config.Inbox.Observer).
type InboxObserver struct {
	received   prometheus.Counter
	dedup      prometheus.Counter
	claimed    prometheus.Counter
	takeovers  prometheus.Counter
	processed  prometheus.Counter
	retries    *prometheus.CounterVec
	deferrals  prometheus.Counter
	dead       *prometheus.CounterVec
	fenced     prometheus.Counter
	handlerDur prometheus.Histogram
	receiveDur prometheus.Histogram
	conflicts  *prometheus.CounterVec
	sequence   *prometheus.CounterVec
}

var (
	_ pgrelay.InboxObserver    = (*InboxObserver)(nil)
	_ pgrelay.SequenceObserver = (*InboxObserver)(nil)
)

// InboxObserverOptions configures NewInboxObserver.
type InboxObserverOptions struct {
	// IngestStats, when set, is read at every scrape for the received and
	// duplicate counts (consumer_received_total, consumer_dedup_total) instead
	// of counting Received calls: use it when the ingest side keeps its own
	// counters (consumer.Consumer.Stats). Default: nil, counting Received.
	IngestStats func() IngestStats
	// Handler is the name of the handler the process's inbox workers run:
	// the handler label of the worker-side series (claimed, processed,
	// retries, deferrals, dead letters, fenced, handler duration). Default
	// pgrelay.DefaultHandlerName.
	Handler string
	// Handlers lists the handlers the ingest side stores rows for, whose
	// consumer_key_conflicts_total series exist from start-up. Default:
	// Handler alone.
	Handlers []string
}

// IngestStats are the ingest side's running totals.
type IngestStats struct {
	// Received counts messages delivered by the broker, redeliveries
	// included.
	Received int64
	// Duplicates counts delivered messages whose event id the inbox already
	// held (absorbed by the unique key).
	Duplicates int64
	// Dead counts messages stored dead at ingest (malformed input).
	Dead int64
	// StoreErrors counts failed attempts to store a batch.
	StoreErrors int64
	// FetchErrors counts failed fetches from the broker.
	FetchErrors int64
	// AppliedOnReceive counts events whose handler ran in the transaction
	// that stored them.
	AppliedOnReceive int64
	// Unacked counts deliveries left unacknowledged while the consumer ran
	// (refused by the database even as dead letters).
	Unacked int64
	// HitRatio is the share of deliveries absorbed as duplicates over the
	// ingest side's last rate interval in which anything arrived (0..1).
	HitRatio float64
}

// NewInboxObserver registers the consumer's inbox metrics on reg and returns
// the observer that drives them.
func NewInboxObserver(reg prometheus.Registerer, opts InboxObserverOptions) *InboxObserver {
	if opts.Handler == "" {
		opts.Handler = pgrelay.DefaultHandlerName
	}
	if len(opts.Handlers) == 0 {
		opts.Handlers = []string{opts.Handler}
	}
	handler := prometheus.Labels{"handler": opts.Handler}
	o := &InboxObserver{
		conflicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "consumer_key_conflicts_total",
			Help: "Deliveries whose dedup key was already stored for the handler with a different payload fingerprint (recorded in inbox_conflicts; the stored event's effect stands).",
		}, []string{"handler"}),
		claimed: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        "consumer_claimed_total",
			Help:        "Inbox events claimed by a worker (each attempt counts once).",
			ConstLabels: handler,
		}),
		takeovers: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        "consumer_lease_takeovers_total",
			Help:        "Inbox events claimed from a worker whose lease expired (stale-lock recovery).",
			ConstLabels: handler,
		}),
		processed: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        "consumer_processed_total",
			Help:        "Inbox events whose handler committed together with the processed mark.",
			ConstLabels: handler,
		}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name:        "consumer_retries_total",
			Help:        "Inbox events put back for another attempt after a transient failure, by reason (error, timeout, panic).",
			ConstLabels: handler,
		}, []string{"reason"}),
		deferrals: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        "consumer_deferrals_total",
			Help:        "Inbox events put back to wait for a dependency (attempt refunded).",
			ConstLabels: handler,
		}),
		dead: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name:        "consumer_dlq_total",
			Help:        "Inbox events moved to the dead letter state, by reason (permanent, attempts_exhausted, worker_lost, deferrals_exhausted, other).",
			ConstLabels: handler,
		}, []string{"reason"}),
		fenced: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        "consumer_fenced_total",
			Help:        "Inbox commits refused because another worker took the event over; the stale side effect was rolled back.",
			ConstLabels: handler,
		}),
		handlerDur: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:        "consumer_handler_duration_seconds",
			Help:        "Time a handler ran for an event that was then processed.",
			ConstLabels: handler,
			Buckets:     latencyBuckets,
		}),
		sequence: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "consumer_sequence_total",
			Help: "Ordered apply (--ordered), by outcome: applied_in_order, duplicate_seq (absorbed without running), " +
				"out_of_order (claimed before an earlier sequence; handed back), held (made to wait for an earlier sequence), " +
				"gap_reported (a key waited longer than --gap-timeout), gap_skipped and dead_skipped (operator skips, " +
				"from the audit trail), parked (a sequenced event went dead; its key waits), fenced, unsequenced " +
				"(no sequence: applied unordered).",
			ConstLabels: handler,
		}, []string{"outcome"}),
		receiveDur: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "consumer_receive_duration_seconds",
			Help:    "Time the inbox's Receive statement took for one fetched batch (the dedup check and insert).",
			Buckets: latencyBuckets,
		}),
	}
	const receivedHelp = "Messages delivered by the broker to the inbox, duplicates included."
	const dedupHelp = "Delivered messages absorbed as duplicates by the inbox's unique event_id."
	if opts.IngestStats != nil {
		reg.MustRegister(
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "consumer_received_total", Help: receivedHelp},
				func() float64 { return float64(opts.IngestStats().Received) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "consumer_dedup_total", Help: dedupHelp},
				func() float64 { return float64(opts.IngestStats().Duplicates) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "consumer_ingest_dead_total",
				Help: "Messages stored dead at ingest because they were malformed (kept with the reason, never dropped)."},
				func() float64 { return float64(opts.IngestStats().Dead) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "consumer_store_errors_total",
				Help: "Failed attempts to store a fetched batch in the inbox (retried; the batch stays unacknowledged)."},
				func() float64 { return float64(opts.IngestStats().StoreErrors) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "consumer_fetch_errors_total",
				Help: "Failed fetches from the broker (retried with backoff)."},
				func() float64 { return float64(opts.IngestStats().FetchErrors) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "consumer_applied_on_receive_total",
				Help: "Events applied in the transaction that stored them (the consumer kept up and the workers were idle); the others are claimed by the workers."},
				func() float64 { return float64(opts.IngestStats().AppliedOnReceive) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "consumer_unacked_total",
				Help: "Deliveries left unacknowledged while the consumer ran, refused by the database even as dead letters (logged with the reason); the broker delivers them again later, and until then such a record holds its Kafka partition's committed offset."},
				func() float64 { return float64(opts.IngestStats().Unacked) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "consumer_dedup_hit_ratio",
				Help: "Share of deliveries absorbed as duplicates over the consumer's last rate interval in which anything arrived (0..1)."},
				func() float64 { return opts.IngestStats().HitRatio }),
		)
	} else {
		o.received = prometheus.NewCounter(prometheus.CounterOpts{Name: "consumer_received_total", Help: receivedHelp})
		o.dedup = prometheus.NewCounter(prometheus.CounterOpts{Name: "consumer_dedup_total", Help: dedupHelp})
		reg.MustRegister(o.received, o.dedup)
	}
	for _, r := range RetryReasons {
		o.retries.WithLabelValues(r)
	}
	for _, r := range DeadReasons {
		o.dead.WithLabelValues(r)
	}
	for _, h := range opts.Handlers {
		o.conflicts.WithLabelValues(h)
	}
	for _, out := range []pgrelay.SeqOutcome{pgrelay.SeqApplied, pgrelay.SeqDuplicate, pgrelay.SeqOutOfOrder, pgrelay.SeqHeld,
		pgrelay.SeqGapReported, pgrelay.SeqGapSkipped, pgrelay.SeqDeadSkipped, pgrelay.SeqParked, pgrelay.SeqFenced, pgrelay.SeqUnsequenced} {
		o.sequence.WithLabelValues(string(out))
	}
	reg.MustRegister(o.claimed, o.takeovers, o.processed, o.retries, o.deferrals, o.dead, o.fenced, o.handlerDur, o.receiveDur,
		o.conflicts, o.sequence)
	return o
}

// Received counts a Receive call's stored rows and duplicates. It does
// nothing when the counts come from InboxObserverOptions.IngestStats.
func (o *InboxObserver) Received(inserted, duplicates int) {
	if o.received == nil {
		return
	}
	o.received.Add(float64(inserted + duplicates))
	o.dedup.Add(float64(duplicates))
}

// ObserveReceive observes the duration of one pgrelay.Receive statement
// (consumer_receive_duration_seconds).
func (o *InboxObserver) ObserveReceive(d time.Duration) { o.receiveDur.Observe(seconds(d)) }

// Claimed counts claims and lease takeovers.
func (o *InboxObserver) Claimed(n, takeovers int) {
	o.claimed.Add(float64(n))
	o.takeovers.Add(float64(takeovers))
}

// Processed counts a processed event and observes its handler's duration.
func (o *InboxObserver) Processed(_ *pgrelay.InboxEvent, d time.Duration) {
	o.processed.Inc()
	o.handlerDur.Observe(seconds(d))
}

// Retried counts a retry by its classified reason.
func (o *InboxObserver) Retried(_ *pgrelay.InboxEvent, reason string) {
	o.retries.WithLabelValues(ClassifyRetry(reason)).Inc()
}

// Deferred counts a deferral.
func (o *InboxObserver) Deferred(*pgrelay.InboxEvent) { o.deferrals.Inc() }

// Dead counts a dead letter by its classified reason.
func (o *InboxObserver) Dead(_ *pgrelay.InboxEvent, reason string) {
	o.dead.WithLabelValues(ClassifyDead(reason)).Inc()
}

// Sequence counts n ordered-apply outcomes.
func (o *InboxObserver) Sequence(out pgrelay.SeqOutcome, n int) {
	o.sequence.WithLabelValues(string(out)).Add(float64(n))
}

// Fenced counts a fenced commit.
func (o *InboxObserver) Fenced(*pgrelay.InboxEvent) { o.fenced.Inc() }

// KeyConflicts counts n key conflicts of a handler
// (consumer_key_conflicts_total{handler}).
func (o *InboxObserver) KeyConflicts(handler string, n int) {
	o.conflicts.WithLabelValues(handler).Add(float64(n))
}
