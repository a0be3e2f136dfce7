// Package natsserver starts an in-process NATS server with JetStream, for the
// demo and the examples; the broker/nats adapter does not depend on it.
package natsserver

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Config configures an in-process NATS server with JetStream.
type Config struct {
	// StoreDir holds JetStream's data. Default: "./.pgrelay/nats".
	StoreDir string
	// Listen is the host:port the server listens on; port 0 picks a free
	// port. Default: "127.0.0.1:4222".
	Listen string
}

// WithDefaults returns the config with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.StoreDir == "" {
		c.StoreDir = "./.pgrelay/nats"
	}
	if c.Listen == "" {
		c.Listen = "127.0.0.1:4222"
	}
	return c
}

// Start starts a NATS server with JetStream in this process and
// returns it with its client URL. Shut it down with Shutdown and
// WaitForShutdown.
func Start(cfg Config) (*server.Server, string, error) {
	cfg = cfg.WithDefaults()
	host, portStr, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return nil, "", fmt.Errorf("broker: embedded NATS listen address %q: %w", cfg.Listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return nil, "", fmt.Errorf("broker: embedded NATS listen address %q: invalid port", cfg.Listen)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	s, err := server.NewServer(&server.Options{
		Host:      host,
		Port:      port,
		JetStream: true,
		StoreDir:  cfg.StoreDir,
		NoSigs:    true,
		NoLog:     true,
	})
	if err != nil {
		return nil, "", fmt.Errorf("broker: embedded NATS: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return nil, "", errors.New("broker: embedded NATS did not become ready within 10s (is " + cfg.Listen + " in use?)")
	}
	return s, s.ClientURL(), nil
}
