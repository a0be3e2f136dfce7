package main

import (
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Config holds the benchmark's settings. The zero value of every field means
// its default, filled in by WithDefaults; Quick switches the sizes to a small
// run that only proves the benchmark works.
type Config struct {
	// DatabaseURL points at the PostgreSQL server's maintenance database. The
	// benchmark creates its own databases there (CREATE DATABASE, migrated
	// with the embedded migrations) and drops them when it ends. Required.
	DatabaseURL string
	// NATSURL is the NATS JetStream server. Empty means an in-process
	// nats-server started for the run (labelled as such in the results).
	NATSURL string
	// Broker is the broker the relay drains publish to: nats, or an adapter
	// registered in relayTargets (which then runs with Only = [relay]).
	// Default "nats".
	Broker string
	// KafkaBrokers is the Kafka cluster of -broker kafka. Empty means kfake,
	// franz-go's in-process fake Kafka, started for the run (labelled as such
	// in the results).
	KafkaBrokers []string
	// OutDir is where results.json, results.svg and results.txt are written.
	// Default "bench-results".
	OutDir string
	// Quick runs small sizes and one repeat: a smoke run, not a measurement.
	Quick bool
	// Repeats is how many times each figure is measured; the report shows the
	// median, min and max. Default 3 (1 in quick mode).
	Repeats int
	// Events is the backlog size of the drain measurements and the number of
	// events the end-to-end flat-out runs push through. Default 10,000 (1,000
	// in quick mode).
	Events int
	// BatchSize is the batch size of the floors (events per transaction).
	// Default 100.
	BatchSize int
	// Workers is the number of concurrent connections the floors and the
	// producers use. Default 4.
	Workers int
	// Prefill is the number of finished rows put in the outbox and the inbox
	// for the scale measurements. Default 1,000,000 (20,000 in quick mode).
	Prefill int
	// LoadDuration is how long each fixed-load latency run offers its load.
	// Default 10s (2s in quick mode).
	LoadDuration time.Duration
	// Loads are the offered loads of the latency runs, in events per second.
	// Default 500 and 5,000, the loads the latency targets name (quick mode: 200).
	Loads []int
	// TunedMaxWait is the consumer's fetch wait (--max-wait) in an extra
	// latency run at the first of Loads, next to the default 500ms. Default
	// 10ms (quick mode: skipped, as a stranded message can hold the run for
	// the consumer's 30 s AckWait); negative skips that run.
	TunedMaxWait time.Duration
	// RelayInstances are the relay counts of the scale measurement. Default
	// 1, 2 and 4 (quick mode: 1 and 2).
	RelayInstances []int
	// RelayDatabases is how many databases the relay group's many-databases
	// drain hands one relay at once, Events rows each. Default 10.
	RelayDatabases int
	// Only, when not empty, restricts the run to these groups: floor, relay,
	// inbox, e2e, scale, cost, wal. The wal group (a private wal_level =
	// logical cluster) runs only when named.
	Only []string
	// Timeout bounds each single measurement; a measurement that does not
	// finish in time is reported as failed and the run goes on. Default 5m
	// (1m in quick mode).
	Timeout time.Duration
	// BinDir, when set, holds prebuilt relay and consumer binaries for the
	// cost measurement; otherwise they are built with `go build` into a
	// temporary directory. Default "".
	BinDir string
	// SQLTrace counts the statements of the in-process services' pools
	// (round trips) by kind and prints them after each end-to-end run. It
	// only applies when the services run in-process (-bin pointing nowhere
	// usable). Default false.
	SQLTrace bool
	// Observer is how the end-to-end runs time each event's ledger credit:
	// "poll" (the first ledger poll that sees it, every 1 ms at the offered
	// loads), "commit-ts" (the crediting transaction's commit timestamp,
	// read after the run; needs track_commit_timestamp = on) or "auto":
	// commit-ts when the server has track_commit_timestamp = on and runs on
	// this machine, poll otherwise. Default "auto".
	Observer string
	// CostLoads are the cost group's offered loads, events/s. Default 500,
	// 2,000 and 5,000 (quick mode: 200).
	CostLoads []int
	// CostStatements loads pg_stat_statements in the cost group's cluster
	// and prints each load's statements per event (it costs the server
	// some CPU: off for the figures). Default false.
	CostStatements bool
	// CostCapture limits the cost group to one capture mode: table, wal or
	// minimal (the minimal pipeline, bench/minimal.go). Default "": all
	// three.
	CostCapture string
	// CostNoFloor skips the cost group's floor (before/after comparisons).
	CostNoFloor bool
	// HorizonRate is the steady load of the horizon group, in events/s.
	// Default 1,000 (quick mode: 200).
	HorizonRate int
	// HorizonHold is how long the horizon group's REPEATABLE READ
	// transaction holds the xmin horizon. Default 10m (quick mode: 20s).
	HorizonHold time.Duration
	// HorizonAfter is how long the horizon group's load goes on after the
	// release. Default 2m (quick mode: 20s).
	HorizonAfter time.Duration
	// HorizonSample is the horizon group's sampling interval. Default 10s
	// (quick mode: 2s).
	HorizonSample time.Duration
	// Logger receives progress messages. Default slog.New(slog.DiscardHandler).
	Logger *slog.Logger
}

// Groups the benchmark knows, in the order it runs them.
var allGroups = []string{"floor", "producer", "relay", "inbox", "inbox-ordered", "e2e", "scale", "cost", "wal", "horizon"}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.OutDir == "" {
		c.OutDir = "bench-results"
	}
	if c.Observer == "" {
		c.Observer = observerAuto
	}
	if c.Broker == "" {
		c.Broker = "nats"
	}
	if c.Repeats == 0 {
		c.Repeats = pick(c.Quick, 1, 3)
	}
	if c.Events == 0 {
		c.Events = pick(c.Quick, 1_000, 10_000)
	}
	if c.BatchSize == 0 {
		c.BatchSize = 100
	}
	if c.Workers == 0 {
		c.Workers = 4
	}
	if c.Prefill == 0 {
		c.Prefill = pick(c.Quick, 20_000, 1_000_000)
	}
	if c.LoadDuration == 0 {
		c.LoadDuration = time.Duration(pick(c.Quick, 2, 10)) * time.Second
	}
	if len(c.Loads) == 0 {
		if c.Quick {
			c.Loads = []int{200}
		} else {
			c.Loads = []int{500, 5_000}
		}
	}
	if c.TunedMaxWait == 0 {
		c.TunedMaxWait = 10 * time.Millisecond
		if c.Quick {
			c.TunedMaxWait = -1
		}
	}
	if c.RelayDatabases == 0 {
		c.RelayDatabases = 10
	}
	if len(c.RelayInstances) == 0 {
		if c.Quick {
			c.RelayInstances = []int{1, 2}
		} else {
			c.RelayInstances = []int{1, 2, 4}
		}
	}
	if c.Timeout == 0 {
		c.Timeout = time.Duration(pick(c.Quick, 1, 5)) * time.Minute
	}
	if c.HorizonRate == 0 {
		c.HorizonRate = pick(c.Quick, 200, 1_000)
	}
	if c.HorizonHold == 0 {
		c.HorizonHold = time.Duration(pick(c.Quick, 20, 600)) * time.Second
	}
	if c.HorizonAfter == 0 {
		c.HorizonAfter = time.Duration(pick(c.Quick, 20, 120)) * time.Second
	}
	if c.HorizonSample == 0 {
		c.HorizonSample = time.Duration(pick(c.Quick, 2, 10)) * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.DatabaseURL == "":
		return errors.New("bench: DatabaseURL (-database-url / BENCH_DATABASE_URL) is required")
	case c.Repeats < 1:
		return fmt.Errorf("bench: Repeats (-repeats) must be at least 1, got %d", c.Repeats)
	case c.Events < c.BatchSize:
		return fmt.Errorf("bench: Events (-events) must be at least BatchSize (%d), got %d", c.BatchSize, c.Events)
	case c.BatchSize < 1 || c.BatchSize > 10_000:
		return fmt.Errorf("bench: BatchSize (-batch) must be in 1..10000, got %d", c.BatchSize)
	case c.Workers < 1 || c.Workers > 32:
		return fmt.Errorf("bench: Workers (-workers) must be in 1..32, got %d", c.Workers)
	case c.Prefill < 0:
		return fmt.Errorf("bench: Prefill (-prefill) must not be negative, got %d", c.Prefill)
	case c.LoadDuration < 100*time.Millisecond:
		return fmt.Errorf("bench: LoadDuration (-load-duration) must be at least 100ms, got %s", c.LoadDuration)
	case c.HorizonRate < 1 || c.HorizonRate > 100_000:
		return fmt.Errorf("bench: HorizonRate (-horizon-rate) must be in 1..100000 events/s, got %d", c.HorizonRate)
	case c.HorizonHold < time.Second || c.HorizonAfter < time.Second || c.HorizonSample < time.Second:
		return fmt.Errorf("bench: -horizon-hold, -horizon-after and -horizon-sample must be at least 1s, got %s, %s, %s", c.HorizonHold, c.HorizonAfter, c.HorizonSample)
	case c.Timeout < time.Second:
		return fmt.Errorf("bench: Timeout (-timeout) must be at least 1s, got %s", c.Timeout)
	}
	switch c.Observer {
	case observerAuto, observerPoll, observerCommitTS:
	default:
		return fmt.Errorf("bench: Observer (-observer) must be auto, poll or commit-ts, got %q", c.Observer)
	}
	for _, l := range c.Loads {
		if l < 1 || l > 1_000_000 {
			return fmt.Errorf("bench: Loads (-loads) must be in 1..1000000 events/s, got %d", l)
		}
	}
	if c.RelayDatabases < 2 || c.RelayDatabases > 50 {
		return fmt.Errorf("bench: RelayDatabases (-relay-databases) must be in 2..50, got %d", c.RelayDatabases)
	}
	for _, n := range c.RelayInstances {
		if n < 1 || n > 16 {
			return fmt.Errorf("bench: RelayInstances (-relays) must be in 1..16, got %d", n)
		}
	}
	for _, g := range c.Only {
		if !contains(allGroups, g) {
			return fmt.Errorf("bench: Only (-only) names unknown group %q; known: %v", g, allGroups)
		}
	}
	return c.checkBroker()
}

// runs reports whether the group is part of this run.
func (c Config) runs(group string) bool {
	if group == "wal" || group == "horizon" { // each starts a private cluster (initdb): only when named
		return contains(c.Only, group)
	}
	return len(c.Only) == 0 || contains(c.Only, group)
}

func pick(quick bool, small, full int) int {
	if quick {
		return small
	}
	return full
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
