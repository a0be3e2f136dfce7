package main

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strconv"

	"github.com/pgrelay/pgrelay/relay"
)

// declareFigures lists every figure of the selected groups up front, so that
// one the run could not measure still appears in the report with the reason.
func (b *bench) declareFigures() {
	r := b.res
	add := func(id, group, name, unit, mode, floor string, target *Target, note string) {
		if !b.cfg.runs(group) {
			return
		}
		f := r.figure(id, group, name, unit)
		f.Mode, f.Floor, f.Target, f.Note = mode, floor, target, note
	}
	ratio := func(v float64, text string) *Target { return &Target{Kind: "ratio>=", Value: v, Text: text} }
	atMost := func(v float64, text string) *Target { return &Target{Kind: "<=", Value: v, Text: text} }
	batch := strconv.Itoa(b.cfg.BatchSize)
	workers := strconv.Itoa(b.cfg.Workers)

	add("floor_outbox_batch", "floor", "outbox floor: insert + read&mark, "+batch+"/tx", unitRate, "sql", "", nil,
		"events / (insert time + mark time); "+workers+" connections; minimal table")
	add("floor_outbox_insert_batch", "floor", "  outbox insert, "+batch+"/tx", unitRate, "sql", "", nil, "")
	add("floor_outbox_mark_batch", "floor", "  outbox read & mark published, "+batch+"/stmt", unitRate, "sql", "", nil, "")
	add("floor_outbox_one", "floor", "outbox floor: insert 1/tx + read&mark", unitRate, "sql", "", nil, "")
	add("floor_outbox_insert_one", "floor", "  outbox insert, 1/tx", unitRate, "sql", "", nil, "")
	add("floor_inbox_batch", "floor", "inbox floor: insert + credit + mark, "+batch+"/tx", unitRate, "sql", "", nil,
		"receive tx (insert) then process tx (select, ledger insert, status update)")
	add("floor_inbox_insert_batch", "floor", "  inbox insert, "+batch+"/tx", unitRate, "sql", "", nil, "")
	add("floor_inbox_process_batch", "floor", "  inbox select + ledger insert + mark, "+batch+"/tx", unitRate, "sql", "", nil, "")
	add("floor_combined_batch", "floor", "combined floor, "+batch+"/tx", unitRate, "sql", "", nil, "events / (sum of outbox and inbox floor phase times)")
	add("floor_combined_one", "floor", "combined floor, 1/tx", unitRate, "sql", "", nil, "")
	// CPU per event of a run, from /proc at its start and end (bench/cpu.go).
	cpuFigures := func(group, run, label, mode string, services bool) {
		benchName := "bench (producers, observer)"
		var comps []string
		if services {
			if b.bins != nil {
				comps = append(comps, cpuRelay, cpuConsumer)
			} else {
				benchName = "relay+consumer+bench (one process)"
			}
		}
		if b.nats != nil && b.nats.srv == nil && services {
			comps = append(comps, cpuNATS)
		} else if services {
			benchName += " + nats-server"
		}
		comps = append(comps, cpuPostgres, cpuBench, cpuOther)
		names := map[string]string{cpuRelay: "relay", cpuConsumer: "consumer", cpuNATS: "nats-server", cpuPostgres: "PostgreSQL (all its processes)",
			cpuBench: benchName, cpuOther: "rest of the machine (busy − the above)"}
		for _, c := range comps {
			add(cpuFigureID(run, c), group, "  cpu/event, "+label+": "+names[c], unitCPUEvent, mode, "", nil, "")
		}
		add(cpuFigureID(run, cpuBusy), group, "  machine busy, "+label, unitBusy, mode, "", nil,
			"busy share of all CPUs over the run, /proc/stat: (user+nice+system+irq+softirq+steal) / (those + idle + iowait)")
	}
	cpuFigures("floor", "floor_batch", "floor "+batch+"/tx", "sql", false)
	cpuFigures("floor", "floor_one", "floor 1/tx", "sql", false)

	// A drain starts from a backlog, so it is compared with the floor of the
	// same work (the read & mark phase, the process phase), not with a floor
	// that also pays for writing the backlog: that would flatter it.
	add("floor_producer_one", "producer", "producer floor: plain-table INSERT, 1/tx, "+strconv.Itoa(producerConns)+" connections", unitRate, "sql", "", nil, "")
	add("producer_one", "producer", "producer: outbox INSERT (triggers), 1/tx, "+strconv.Itoa(producerConns)+" connections", unitRate, "sql", "floor_producer_one", ratio(0.8, "≥ 0.8× plain insert"), "")
	add("producer_one_noseq", "producer", "  producer: outbox INSERT keyed by its own id (key lock, no per-key sequence), 1/tx", unitRate, "sql", "", nil, "")
	add("producer_one_seq", "producer", "  producer with per-key sequences (= producer_one), against the same without", unitRate, "sql", "producer_one_noseq", nil, "")
	add("floor_relay_mark", "relay", "  relay floor part: read & mark, "+batch+"/stmt", unitRate, "sql", "", nil, "")
	add("floor_broker", "relay", "  relay floor part: JetStream async publish with msg ids, window "+batch, unitRate, "nats", "", nil, "")
	add("floor_relay", "relay", "relay floor: read & mark then publish", unitRate, "sql+nats", "", nil, "1 / (1/read&mark + 1/broker), measured in the same run")
	if b.cfg.Broker == "kafka" {
		// The floors publish to NATS: no ratio against them.
		add("relay_drain", "relay", "relay drain (backlog → Kafka, kfake unless -kafka-brokers, marked)", unitRate, "in-process", "", nil, "")
	} else {
		add("relay_drain", "relay", "relay drain (backlog → "+b.cfg.Broker+", marked)", unitRate, "in-process", "floor_relay", ratio(0.8, "≥ 0.8× relay floor"), "")
	}
	add("relay_drain_databases", "relay", "relay drain, "+strconv.Itoa(b.cfg.RelayDatabases)+" databases at once (one relay), against one database", unitRate, "in-process", "relay_drain", nil, "")
	add("relay_drain_default", "relay", "relay drain, the relay's default batch ("+strconv.Itoa(relay.DefaultBatchSize)+")", unitRate, "in-process", "floor_relay", nil, "")
	add("inbox_drain", "inbox", "inbox drain (claim, ledger credit, mark)", unitRate, "in-process", "floor_inbox_process_batch", ratio(0.5, "≥ 0.5× inbox floor"), "")
	add("inbox_keyed_unordered", "inbox-ordered", "inbox drain, keyed events with sequences, unordered handler", unitRate, "in-process", "", nil, "")
	add("inbox_keyed_ordered", "inbox-ordered", "inbox drain, the same events, ordered handler (--ordered)", unitRate, "in-process", "inbox_keyed_unordered", nil, "")

	add("e2e_batch", "e2e", "end to end, "+batch+" events/tx", unitRate, "process", "floor_combined_batch", ratio(0.5, "≥ 0.5× combined floor"), "")
	cpuFigures("e2e", "e2e_batch", "flat out "+batch+"/tx", "process", true)
	add("e2e_one", "e2e", "end to end, 1 event/tx", unitRate, "process", "floor_combined_one", ratio(0.7, "≥ 0.7× 1-event floor"), "")
	var loads []string
	for _, l := range b.cfg.Loads {
		loads = append(loads, strconv.Itoa(l))
	}
	for _, l := range append(loads, "max") {
		label := "at " + l + " events/s offered"
		if l == "max" {
			label = "flat out (1/tx)"
		}
		var p50, p99 *Target
		switch l {
		case "500":
			p50 = atMost(5, "p50 ≤ 5 ms")
		case "5000":
			p50, p99 = atMost(10, "p50 ≤ 10 ms"), atMost(50, "p99 ≤ 50 ms")
		}
		add("latency_"+l+"_p50", "e2e", "commit→ledger p50, "+label, unitMs, "process", "", p50, "")
		add("latency_"+l+"_p99", "e2e", "commit→ledger p99, "+label, unitMs, "process", "", p99, "")
		add("latency_"+l+"_max", "e2e", "commit→ledger max, "+label, unitMs, "process", "", nil, "")
		if l != "max" {
			add("achieved_"+l, "e2e", "  achieved rate, "+label, unitRate, "process", "", nil, "")
			add("stage_"+l+"_relay", "e2e", "  stage p50: commit → relay marks it published", unitMs, "process", "", nil,
				"one clock: the producer's commit returning to outbox.published_at (the mark's transaction start, after the broker ack): wake-up, read, publish")
			add("stage_"+l+"_consumer", "e2e", "  stage p50: marked → consumer stores it", unitMs, "process", "", nil,
				"outbox.published_at to inbox.received_at (the storing transaction's start); the message can arrive before the mark starts")
			add("stage_"+l+"_inbox", "e2e", "  stage p50: stored → credit seen", unitMs, "process", "", nil,
				"inbox.received_at to the observer's poll seeing the ledger credit: the consumer's transaction (store, apply) and its commit")
			cpuFigures("e2e", "load_"+l, l+"/s", "process", true)
		} else {
			cpuFigures("e2e", "e2e_one", "flat out 1/tx", "process", true)
		}
	}

	if b.cfg.TunedMaxWait > 0 {
		label := "at " + strconv.Itoa(b.cfg.Loads[0]) + "/s, consumer --max-wait " + b.cfg.TunedMaxWait.String()
		add("latency_tuned_p50", "e2e", "commit→ledger p50, "+label, unitMs, "process", "", nil, "")
		add("latency_tuned_p99", "e2e", "commit→ledger p99, "+label, unitMs, "process", "", nil, "")
		add("latency_tuned_max", "e2e", "commit→ledger max, "+label, unitMs, "process", "", nil, "")
	}

	prefill := strconv.Itoa(b.cfg.Prefill)
	// Each prefilled drain is paired with an empty-table drain run just
	// before it, so that the ratio compares like with like on a machine
	// whose load drifts.
	add("scale_relay_empty", "scale", "relay drain, empty table (paired)", unitRate, "in-process", "", nil, "")
	add("scale_relay_prefilled", "scale", "relay drain, "+prefill+" published rows in table", unitRate, "in-process", "scale_relay_empty", ratio(0.9, "≥ 0.9× empty"), "")
	add("scale_inbox_empty", "scale", "inbox drain, empty table (paired)", unitRate, "in-process", "", nil, "")
	add("scale_inbox_prefilled", "scale", "inbox drain, "+prefill+" processed rows in table", unitRate, "in-process", "scale_inbox_empty", ratio(0.9, "≥ 0.9× empty"), "")
	add("scale_inbox_retention", "scale", "inbox drain during retention cleanup", unitRate, "in-process", "scale_inbox_prefilled", nil, "")
	add("scale_relay_retention", "scale", "relay drain during retention cleanup", unitRate, "in-process", "scale_relay_prefilled", nil, "")
	for _, n := range b.cfg.RelayInstances {
		add("scale_relays_"+strconv.Itoa(n), "scale", "relay drain, "+strconv.Itoa(n)+" relay instance(s)", unitRate, "in-process", "relay_drain", nil, "")
	}

	b.declareWALFigures(add)
	// A held horizon (bench/horizon.go): one run, its samples printed as a table.
	hold := b.cfg.HorizonHold.String()
	add("horizon_backlog_end", "horizon", "held horizon: events unapplied at the end of a "+hold+" hold", "events", "in-process", "", nil, "")
	add("horizon_outbox_oldest_end", "horizon", "  oldest pending outbox row at the end of the hold", unitMs, "in-process", "", atMost(1000, "lag < 1 s"), "")
	add("horizon_inbox_oldest_end", "horizon", "  oldest pending inbox row at the end of the hold", unitMs, "in-process", "", atMost(1000, "lag < 1 s"), "")
	add("horizon_applied_hold", "horizon", "  applied rate, last third of the hold", unitRate, "in-process", "", nil, "")
	add("horizon_inbox_claim_first", "horizon", "  inbox claim (ClaimInbox), mean, first sample of the hold", unitMs, "in-process", "", nil, "pg_stat_statements")
	add("horizon_inbox_claim_last", "horizon", "  inbox claim, mean, last sample of the hold", unitMs, "in-process", "", nil, "")
	add("horizon_relay_claim_first", "horizon", "  relay claim (PendingBatch, PendingBatchMany), mean, first sample of the hold", unitMs, "in-process", "", nil, "pg_stat_statements")
	add("horizon_relay_claim_last", "horizon", "  relay claim, mean, last sample of the hold", unitMs, "in-process", "", nil, "")
	add("horizon_inbox_dead_end", "horizon", "  dead inbox tuples at the end of the hold", "tuples", "in-process", "", nil, "pg_stat_user_tables.n_dead_tup")
	add("horizon_recovery", "horizon", "  recovery after the release", unitMs, "in-process", "", atMost(60_000, "≤ 1 min"), "")
	add("horizon_drain_after", "horizon", "  applied rate, first sample after the release", unitRate, "in-process", "", nil, "")

	b.declareCostFigures(add)
}

// runGroup measures one group, cfg.Repeats times.
func (b *bench) runGroup(ctx context.Context, group string) {
	switch group {
	case "floor":
		for i := range b.cfg.Repeats {
			b.attempt(ctx, "floors", []string{"floor_outbox_batch", "floor_inbox_batch", "floor_outbox_one", "floor_combined_batch", "floor_combined_one"}, func(ctx context.Context) error {
				ft, err := b.runFloors(ctx)
				if err != nil {
					return err
				}
				n := b.cfg.Events
				b.sample("floor_outbox_batch", rate(n, ft.outboxInsertBatch+ft.outboxMarkBatch))
				b.sample("floor_outbox_insert_batch", rate(n, ft.outboxInsertBatch))
				b.sample("floor_outbox_mark_batch", rate(n, ft.outboxMarkBatch))
				b.sample("floor_outbox_one", rate(n, ft.outboxInsertOne+ft.outboxMarkOne))
				b.sample("floor_outbox_insert_one", rate(n, ft.outboxInsertOne))
				b.sample("floor_inbox_batch", rate(n, ft.inboxInsert+ft.inboxProcess))
				b.sample("floor_inbox_insert_batch", rate(n, ft.inboxInsert))
				b.sample("floor_inbox_process_batch", rate(n, ft.inboxProcess))
				b.sample("floor_combined_batch", rate(n, ft.outboxInsertBatch+ft.outboxMarkBatch+ft.inboxInsert+ft.inboxProcess))
				b.sample("floor_combined_one", rate(n, ft.outboxInsertOne+ft.outboxMarkOne+ft.inboxInsert+ft.inboxProcess))
				b.recordCPU("floor_batch", ft.cpuBatch, n)
				b.recordCPU("floor_one", ft.cpuOne, n)
				b.log.Info("floors", slog.Int("repeat", i+1))
				return nil
			})
		}
	case "wal":
		b.runWALGroup(ctx)
	default:
		b.runPipelineGroup(ctx, group)
	}
}

// sample records one measurement of a figure.
func (b *bench) sample(id string, v float64) {
	if f := b.res.lookup(id); f != nil {
		f.add(v)
	}
}

// fail records why figures could not be measured (the first reason wins).
func (b *bench) fail(ids []string, err error) {
	for _, id := range ids {
		if f := b.res.lookup(id); f != nil && f.Error == "" {
			f.Error = err.Error()
		}
	}
}

// attempt runs one measurement under the per-measurement timeout, turning an
// error or a panic into a recorded failure of the given figures.
func (b *bench) attempt(ctx context.Context, what string, ids []string, fn func(ctx context.Context) error) {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.Timeout)
	defer cancel()
	err := func() (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("panic: %v\n%s", p, debug.Stack())
			}
		}()
		return fn(ctx)
	}()
	if err != nil {
		b.log.Warn("measurement failed", slog.String("what", what), slog.Any("error", err))
		b.fail(ids, fmt.Errorf("%s: %w", what, err))
	}
}
