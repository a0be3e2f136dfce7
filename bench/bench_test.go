package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/pgrelay/pgrelay/internal/testcluster"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

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
		// A short fetch wait can strand a message until the consumer's
		// AckWait (30 s); the full run measures it, the test need not.
		TunedMaxWait: -1,
		LoadDuration: time.Second,
		// A held horizon of a few seconds proves the group runs.
		HorizonHold: 3 * time.Second, HorizonAfter: 3 * time.Second, HorizonSample: time.Second,
		Logger: zaptest.NewLogger(t),
	})
	require.NoError(t, err)
	require.NotEmpty(t, res.Figures)
	_, noCluster := os.Stat(filepath.Join(testcluster.BinDir(), "initdb"))
	for _, f := range res.Figures {
		if f.Group == "horizon" && noCluster != nil {
			continue // the held horizon runs on a private cluster
		}
		require.Empty(t, f.Error, "figure %s", f.ID)
		require.NotEmpty(t, f.Samples, "figure %s has no sample", f.ID)
		if strings.HasPrefix(f.ID, "stage_") && strings.HasSuffix(f.ID, "_inbox") || f.Group == "horizon" {
			// Events applied on receive are credited by the transaction
			// that stores them: that stage is then 0. The held horizon's
			// backlog and oldest pending rows are 0 when the pipeline
			// keeps up.
			require.GreaterOrEqual(t, f.Median, 0.0, "figure %s", f.ID)
			continue
		}
		require.Greater(t, f.Median, 0.0, "figure %s", f.ID)
	}
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
