package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	pgnats "github.com/pgrelay/pgrelay/broker/nats"
)

// natsEnv is the NATS JetStream server of the run: an external one (NATS_URL)
// or one started in this process, and the streams the run created on it.
type natsEnv struct {
	url     string
	where   string
	version string
	nc      *nats.Conn
	js      jetstream.JetStream
	srv     *server.Server
	dir     string
	log     *slog.Logger
	streams []string
	// pid is an external nats-server's process, for its CPU time; 0 when
	// it is not found (pidErr says why) or the server runs in this process.
	pid    int
	pidErr string
}

func startNATS(ctx context.Context, url string, log *slog.Logger) (*natsEnv, error) {
	e := &natsEnv{url: url, where: "external " + url, log: log}
	if url == "" {
		dir, err := os.MkdirTemp("", "pgrelay-bench-nats-")
		if err != nil {
			return nil, fmt.Errorf("in-process NATS: %w", err)
		}
		e.dir = dir
		e.srv, err = server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: dir, NoSigs: true, NoLog: true})
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("in-process NATS: %w", err)
		}
		go e.srv.Start()
		if !e.srv.ReadyForConnections(10 * time.Second) {
			e.close()
			return nil, errors.New("in-process NATS: not ready within 10s")
		}
		e.url = e.srv.ClientURL()
		e.where = "in-process nats-server " + server.VERSION
	}
	var err error
	e.nc, err = nats.Connect(e.url, nats.Timeout(5*time.Second))
	if err != nil {
		e.close()
		return nil, fmt.Errorf("NATS at %s (-nats-url / NATS_URL): %w", e.url, err)
	}
	e.js, err = jetstream.New(e.nc)
	if err != nil {
		e.close()
		return nil, fmt.Errorf("NATS JetStream: %w", err)
	}
	if _, err := e.js.AccountInfo(ctx); err != nil {
		e.close()
		return nil, fmt.Errorf("NATS at %s has no JetStream: %w", e.url, err)
	}
	e.version = e.nc.ConnectedServerVersion()
	if e.srv == nil {
		if e.pid, err = findNATSServer(e.url); err != nil {
			e.pidErr = err.Error()
		}
	}
	return e, nil
}

// stream creates a fresh stream over a fresh subject prefix, deleted when the
// run ends. It returns the stream name and the prefix (subjects "<prefix>.>").
func (e *natsEnv) stream(ctx context.Context) (string, string, error) {
	suffix := randomHex(5)
	name, prefix := "PGRELAYBENCH"+strings.ToUpper(suffix), "pgrelaybench"+suffix
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := e.js.CreateStream(ctx, pgnats.StreamSpec{Name: name, SubjectPrefix: prefix}.Config())
	if err != nil {
		return "", "", fmt.Errorf("create NATS stream: %w", err)
	}
	e.streams = append(e.streams, name)
	return name, prefix, nil
}

// dropStream deletes a stream now rather than at the end, to keep the
// server's disk use bounded over a long run.
func (e *natsEnv) dropStream(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.js.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		e.log.Warn("delete NATS stream", slog.String("stream", name), slog.Any("error", err))
	}
}

func (e *natsEnv) close() {
	if e.nc != nil && !e.nc.IsClosed() {
		for _, s := range e.streams {
			e.dropStream(s)
		}
		e.nc.Close()
	}
	if e.srv != nil {
		e.srv.Shutdown()
		e.srv.WaitForShutdown()
	}
	if e.dir != "" {
		os.RemoveAll(e.dir)
	}
}
