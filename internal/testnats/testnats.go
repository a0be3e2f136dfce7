// Package testnats gives tests a NATS JetStream server: the one at NATS_URL
// when set; otherwise, when PGRELAY_CONTAINER_TESTS is set, a container
// started with testcontainers-go from PGRELAY_NATS_IMAGE (by default the
// official nats:2.11-alpine, as docker-compose.yml uses); otherwise an
// in-process server whose data lives in t.TempDir().
// Tests that share a server isolate themselves with Stream, which creates a
// uniquely named stream over a unique subject prefix.
package testnats

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

// DefaultNATSImage is the image started when PGRELAY_NATS_IMAGE is unset.
const DefaultNATSImage = "nats:2.11-alpine"

// URL returns the URL of a NATS server with JetStream for the test.
func URL(tb testing.TB) string {
	tb.Helper()
	if u := os.Getenv("NATS_URL"); u != "" {
		return u
	}
	if os.Getenv("PGRELAY_CONTAINER_TESTS") != "" {
		return StartContainer(tb)
	}
	s := Start(tb, tb.TempDir(), -1)
	return s.ClientURL()
}

// StartContainer starts a NATS server with JetStream in a container (a
// generic testcontainers-go container from PGRELAY_NATS_IMAGE), removes it
// when the test ends, and returns its client URL on the published port. The
// test fails when no Docker engine runs: the caller asked for a container.
func StartContainer(tb testing.TB) string {
	tb.Helper()
	image := os.Getenv("PGRELAY_NATS_IMAGE")
	if image == "" {
		image = DefaultNATSImage
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The official images and deploy/images' one all take server flags as
	// the command. The image may have no shell, so the port check is external.
	c, err := testcontainers.Run(ctx, image,
		testcontainers.WithExposedPorts("4222/tcp"),
		testcontainers.WithCmd("-js", "-sd", "/tmp/nats"),
		testcontainers.WithWaitStrategy(
			wait.ForLog("Server is ready"),
			wait.ForListeningPort("4222/tcp").SkipInternalCheck(),
		),
	)
	testcontainers.CleanupContainer(tb, c)
	if err != nil {
		tb.Fatalf("testnats: NATS container from %s (is a Docker engine running?): %v", image, err)
	}
	endpoint, err := c.PortEndpoint(ctx, "4222/tcp", "nats")
	if err != nil {
		tb.Fatalf("testnats: NATS container endpoint: %v", err)
	}
	tb.Logf("testnats: NATS container %.12s from image %s at %s", c.GetContainerID(), image, endpoint)
	return endpoint
}

// Start starts an in-process NATS server with JetStream storing in dir, on
// port (-1 picks a free one), and shuts it down when the test ends. Starting a
// second server on the same dir and port after Shutdown simulates a restart.
func Start(tb testing.TB, dir string, port int) *server.Server {
	tb.Helper()
	s, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: dir, NoSigs: true, NoLog: true,
	})
	if err != nil {
		tb.Fatalf("testnats: new server: %v", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		tb.Fatalf("testnats: server not ready")
	}
	tb.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s
}

// Stream creates a stream with a unique name over a unique subject prefix on
// the server at url and deletes it when the test ends. It returns the stream
// name and the subject prefix (subjects are "<prefix>.>").
func Stream(tb testing.TB, url string) (stream, prefix string) {
	tb.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	suffix := hex.EncodeToString(b)
	stream, prefix = "T"+strings.ToUpper(suffix), "t"+suffix
	nc, js := Connect(tb, url)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		// A day's MaxAge keeps the stream within the consumer's dedup
		// window, which it checks at attach.
		Name: stream, Subjects: []string{prefix + ".>"}, Storage: jetstream.FileStorage, MaxAge: 24 * time.Hour,
	}); err != nil {
		tb.Fatalf("testnats: create stream: %v", err)
	}
	tb.Cleanup(func() {
		if nc.IsClosed() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, stream)
	})
	return stream, prefix
}

// Connect opens a client connection, closed when the test ends.
func Connect(tb testing.TB, url string) (*nats.Conn, jetstream.JetStream) {
	tb.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		tb.Fatalf("testnats: connect %s: %v", url, err)
	}
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatalf("testnats: jetstream: %v", err)
	}
	return nc, js
}
