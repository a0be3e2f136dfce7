package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/logtest"
	"github.com/pgrelay/pgrelay/internal/testcluster"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// TestMain runs the minimal pipeline's processes when the cost group starts
// this test binary as one of them (bench/minimal.go), the tests otherwise.
func TestMain(m *testing.M) {
	exitIfMinimal()
	os.Exit(m.Run())
}

// TestQuick runs the benchmark's quick mode against the test server and
// checks that it measured every figure it declared and wrote its outputs.
func TestQuick(t *testing.T) {
	t.Parallel()
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := Run(ctx, Config{
		DatabaseURL: testdb.ServerURL(t),
		NATSURL:     os.Getenv("NATS_URL"),
		OutDir:      out,
		Quick:       true,
		Events:      500,
		Prefill:     2_000,
		// The cost group starts a private cluster: TestQuickCost.
		Only: []string{"floor", "producer", "relay", "inbox", "inbox-ordered", "e2e", "scale"},
		// A short fetch wait can strand a message until the consumer's
		// AckWait (30 s); the full run measures it, the test need not.
		TunedMaxWait: -1,
		LoadDuration: time.Second,
		Logger:       logtest.New(t),
	})
	require.NoError(t, err)
	require.NotEmpty(t, res.Figures)
	cpuFigures := 0
	// A run's components together used some CPU; one of them alone may
	// stay below the clock tick of /proc (10 ms) in a quick run.
	runCPU := map[string]float64{}
	for _, f := range res.Figures {
		if strings.HasPrefix(f.ID, "cpu_") && f.Unit != unitCPU {
			cpuFigures++
			// A server on another machine (or in a container) is n/a.
			if f.Error != "" {
				require.Regexp(t, "not on this machine|no process found|a component is not measured", f.Error, "figure %s", f.ID)
				continue
			}
			require.NotEmpty(t, f.Samples, "figure %s has no sample", f.ID)
			run, component := f.ID[len("cpu_"):strings.LastIndexByte(f.ID, '_')], f.ID[strings.LastIndexByte(f.ID, '_')+1:]
			switch component {
			case cpuOther: // a difference of two clocks: may be below 0
			case cpuBusy:
				require.Greater(t, f.Median, 0.0, "figure %s", f.ID)
			default:
				require.GreaterOrEqual(t, f.Median, 0.0, "figure %s", f.ID)
				runCPU[run] += f.Median
			}
			continue
		}
		require.Empty(t, f.Error, "figure %s", f.ID)
		require.NotEmpty(t, f.Samples, "figure %s has no sample", f.ID)
		if strings.HasPrefix(f.ID, "stage_") && strings.HasSuffix(f.ID, "_consumer") {
			// The consumer may store an event before the relay's mark
			// starts (the broker acknowledged the publish first): this
			// stage is small and may be negative.
			continue
		}
		if strings.HasPrefix(f.ID, "stage_") && strings.HasSuffix(f.ID, "_inbox") {
			// Events applied on receive are credited by the transaction
			// that stores them: that stage is then 0.
			require.GreaterOrEqual(t, f.Median, 0.0, "figure %s", f.ID)
			continue
		}
		require.Greater(t, f.Median, 0.0, "figure %s", f.ID)
	}
	// The floors' two runs, and the e2e group's flat-out runs and its load,
	// each with PostgreSQL, the bench process, the rest and the busy share at
	// least.
	require.GreaterOrEqual(t, cpuFigures, 2*4+3*4)
	for run, cpu := range runCPU {
		require.Greater(t, cpu, 0.0, "the components of run %s", run)
	}
	require.NotNil(t, res.lookup(cpuFigureID("floor_one", cpuPostgres)))
	require.NotNil(t, res.lookup("relay_drain_databases"), "the relay drain over many databases at once")
	require.NotNil(t, res.lookup(cpuFigureID("load_200", cpuBusy)))
	require.Contains(t, res.Settings, "observer")
	for _, name := range []string{"results.json", "results.txt", "results.svg"} {
		b, err := os.ReadFile(filepath.Join(out, name))
		require.NoError(t, err)
		require.NotEmpty(t, b, name)
	}
	var decoded Results
	b, _ := os.ReadFile(filepath.Join(out, "results.json"))
	require.NoError(t, json.Unmarshal(b, &decoded))
	require.Len(t, decoded.Figures, len(res.Figures))
}

// TestQuickWAL runs the wal group's quick mode (a private wal_level =
// logical cluster) and checks that it measured every figure.
func TestQuickWAL(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat(filepath.Join(testcluster.BinDir(), "initdb")); err != nil {
		t.Skipf("no PostgreSQL server binaries for a private cluster: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := Run(ctx, Config{
		DatabaseURL: testdb.ServerURL(t), NATSURL: os.Getenv("NATS_URL"), OutDir: t.TempDir(),
		Quick: true, Events: 500, LoadDuration: time.Second, Only: []string{"wal"}, Logger: logtest.NewAt(t, slog.LevelWarn),
	})
	require.NoError(t, err)
	var ids []string
	for _, f := range res.Figures {
		require.Empty(t, f.Error, "figure %s", f.ID)
		require.Greater(t, f.Median, 0.0, "figure %s", f.ID)
		ids = append(ids, f.ID)
	}
	require.Contains(t, ids, "wal_producer_emit")
	require.Contains(t, ids, "wal_pub_wal_p50")
	require.Contains(t, ids, "wal_relay_wal")
}

// TestQuickCost runs the cost group's quick mode (a private cluster and
// nats-server, the binaries) and checks that it measured every figure.
func TestQuickCost(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat(filepath.Join(testcluster.BinDir(), "initdb")); err != nil {
		t.Skipf("no PostgreSQL server binaries for a private cluster: %v", err)
	}
	if _, err := exec.LookPath("nats-server"); err != nil && os.Getenv("BENCH_NATS_SERVER") == "" {
		t.Skipf("no nats-server for the cost group: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	res, err := Run(ctx, Config{
		DatabaseURL: testdb.ServerURL(t), NATSURL: os.Getenv("NATS_URL"), OutDir: t.TempDir(),
		Quick: true, Events: 500, Prefill: 2_000, LoadDuration: time.Second, Only: []string{"cost"},
		Logger: logtest.NewAt(t, slog.LevelWarn),
	})
	require.NoError(t, err)
	var ids []string
	for _, f := range res.Figures {
		require.Equal(t, "cost", f.Group, "figure %s", f.ID)
		require.Empty(t, f.Error, "figure %s", f.ID)
		require.NotEmpty(t, f.Samples, "figure %s has no sample", f.ID)
		if f.Unit == unitCPUEvent || f.Unit == "cpu-s/s" {
			// One process alone may stay below the clock tick of /proc
			// (10 ms) in a quick run's short windows.
			require.GreaterOrEqual(t, f.Median, 0.0, "figure %s", f.ID)
		} else {
			require.Greater(t, f.Median, 0.0, "figure %s", f.ID)
		}
		ids = append(ids, f.ID)
	}
	require.Contains(t, ids, "cost_table_200_total")
	require.Contains(t, ids, "cost_wal_idle_total")
	require.Contains(t, ids, "cost_wal_flat")
	require.Contains(t, ids, "cost_minimal_200_total")
	require.Contains(t, ids, "cost_minimal_flat")
	// Each capture's total is compared with the minimal pipeline's at the
	// same load.
	byID := make(map[string]*Figure, len(res.Figures))
	for _, f := range res.Figures {
		byID[f.ID] = f
	}
	for _, m := range []string{"table", "wal"} {
		f := byID["cost_"+m+"_200_total"]
		require.Equal(t, "cost_minimal_200_total", f.Floor, "figure %s", f.ID)
		if byID[f.Floor].Median > 0 {
			require.InDelta(t, f.Median/byID[f.Floor].Median, f.Ratio, 1e-9, "figure %s", f.ID)
		}
	}
	require.Empty(t, byID["cost_minimal_200_total"].Floor)
}

// TestQuickHorizon runs the horizon group with a held horizon of a few
// seconds on a private cluster and checks that it measured every figure.
func TestQuickHorizon(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat(filepath.Join(testcluster.BinDir(), "initdb")); err != nil {
		t.Skipf("no PostgreSQL server binaries for a private cluster: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := Run(ctx, Config{
		DatabaseURL: testdb.ServerURL(t), NATSURL: os.Getenv("NATS_URL"), OutDir: t.TempDir(),
		Quick: true, Events: 500, LoadDuration: time.Second, Only: []string{"horizon"},
		HorizonHold: 3 * time.Second, HorizonAfter: 3 * time.Second, HorizonSample: time.Second,
		Logger: logtest.NewAt(t, slog.LevelWarn),
	})
	require.NoError(t, err)
	require.NotEmpty(t, res.Figures)
	for _, f := range res.Figures {
		require.Equal(t, "horizon", f.Group, "figure %s", f.ID)
		require.Empty(t, f.Error, "figure %s", f.ID)
		require.NotEmpty(t, f.Samples, "figure %s has no sample", f.ID)
		// The backlog and the oldest pending rows are 0 when the pipeline
		// keeps up.
		require.GreaterOrEqual(t, f.Median, 0.0, "figure %s", f.ID)
	}
}
