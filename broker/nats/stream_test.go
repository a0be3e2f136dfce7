package nats_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/broker/nats"
	"github.com/pgrelay/pgrelay/internal/logtest"
	"github.com/pgrelay/pgrelay/internal/testnats"
)

func uniqueStream(t *testing.T) (name, prefix string) {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	s := hex.EncodeToString(b)
	return "S" + strings.ToUpper(s), "s" + s
}

// TestCreateStreamLeavesAnExistingStreamAlone: the relay's --create-stream on
// a stream an operator configured (MaxAge 6 days, duplicate window 30
// minutes, 1 GiB) changes nothing and warns, naming the settings that differ
// from what pgrelay would create.
func TestCreateStreamLeavesAnExistingStreamAlone(t *testing.T) {
	t.Parallel()
	url := testnats.URL(t)
	_, js := testnats.Connect(t, url)
	name, prefix := uniqueStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	operator := jetstream.StreamConfig{Name: name, Subjects: []string{prefix + ".>"}, Storage: jetstream.FileStorage,
		MaxAge: 6 * 24 * time.Hour, Duplicates: 30 * time.Minute, MaxBytes: 1 << 30}
	_, err := js.CreateStream(ctx, operator)
	require.NoError(t, err)
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })

	core, logs := logtest.Observe(slog.LevelWarn)
	p, err := nats.NewPublisher(ctx, nats.Config{URL: url, Stream: name, SubjectPrefix: prefix, CreateStream: true,
		StreamMaxAge: 24 * time.Hour, Logger: core})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })

	s, err := js.Stream(ctx, name)
	require.NoError(t, err)
	got := s.CachedInfo().Config
	require.Equal(t, 6*24*time.Hour, got.MaxAge, "MaxAge unchanged")
	require.Equal(t, 30*time.Minute, got.Duplicates, "duplicate window unchanged")
	require.Equal(t, int64(1<<30), got.MaxBytes, "MaxBytes unchanged")

	warned := logs.FilterMessageSnippet("differs from pgrelay's settings").All()
	require.Len(t, warned, 1, "a mismatch is reported")
	fields := fmt.Sprint(warned[0].ContextMap()["fields"])
	require.Contains(t, fields, "MaxAge: got 144h0m0s, pgrelay would create 24h0m0s")
	require.Contains(t, fields, "Duplicates: got 30m0s, pgrelay would create 2m0s")
}

// TestCreateStreamWhenMissing: a missing stream is created with pgrelay's
// settings, MaxAge included; a second creation finds it and says nothing.
func TestCreateStreamWhenMissing(t *testing.T) {
	t.Parallel()
	url := testnats.URL(t)
	_, js := testnats.Connect(t, url)
	name, prefix := uniqueStream(t)
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	core, logs := logtest.Observe(slog.LevelWarn)
	spec := nats.StreamSpec{Name: name, SubjectPrefix: prefix}
	info, err := nats.EnsureStream(ctx, js, spec, core)
	require.NoError(t, err)
	require.Equal(t, nats.DefaultStreamMaxAge, info.Config.MaxAge)
	require.Equal(t, nats.DefaultDuplicateWindow, info.Config.Duplicates)
	require.Equal(t, []string{prefix + ".>"}, info.Config.Subjects)
	again, err := nats.EnsureStream(ctx, js, spec, core)
	require.NoError(t, err)
	require.Equal(t, info.Created, again.Created, "the same stream")
	require.Zero(t, logs.Len(), "no mismatch to report")

	short := nats.StreamSpec{Name: name, SubjectPrefix: prefix, MaxAge: time.Minute}.Config()
	require.Equal(t, time.Minute, short.Duplicates, "the duplicate window is capped at MaxAge")
	require.Zero(t, nats.StreamSpec{Name: name, SubjectPrefix: prefix, MaxAge: -1}.Config().MaxAge, "negative: no limit")
}

func TestStreamSpecReplicas(t *testing.T) {
	require.Equal(t, 1, nats.StreamSpec{Name: "s", SubjectPrefix: "p"}.Config().Replicas, "zero means one replica")
	require.Equal(t, 3, nats.StreamSpec{Name: "s", SubjectPrefix: "p", Replicas: 3}.Config().Replicas)
}
