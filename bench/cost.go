package main

import (
	"context"
)

// startProcesses runs the relay and the consumer binaries against the
// pipeline's database and stream, with their default settings otherwise.
func (p *pipeline) startProcesses(ctx context.Context) error {
	b := p.b
	p.mode = "process"
	p.procs = map[string]*process{}
	// Settings go through the environment, which both binaries read and
	// which tolerates a setting one of them does not know; the metrics and
	// health endpoints listen on free ports and the admin API is off, so a
	// run never collides with a relay or consumer already on the defaults.
	common := []string{"LOG_LEVEL=warn", "LOG_FORMAT=console", "DATABASE_URL=" + p.url, "NATS_URL=" + b.nats.url,
		"METRICS_ADDR=127.0.0.1:0", "ADMIN_ADDR="}
	relayProc, err := startProcess("relay", b.bins.relay, []string{"run"}, append(common,
		"RELAY_STREAM="+p.stream, "RELAY_SUBJECT_PREFIX="+p.prefix))
	if err != nil {
		return err
	}
	p.procs["relay"] = relayProc
	consumerEnv := append(common, "CONSUMER_STREAM="+p.stream, "CONSUMER_SUBJECT_PREFIX="+p.prefix,
		"CONSUMER_DURABLE=bench", "CONSUMER_HTTP_ADDR=127.0.0.1:0", "CONSUMER_STATS_INTERVAL_SEC=-1")
	if p.maxWait > 0 {
		consumerEnv = append(consumerEnv, "CONSUMER_MAX_WAIT="+p.maxWait.String())
	}
	consumerProc, err := startProcess("consumer", b.bins.consumer, []string{"run"}, consumerEnv)
	if err != nil {
		relayProc.stop()
		return err
	}
	p.procs["consumer"] = consumerProc
	stopped := make(chan struct{})
	p.stop = func() {
		close(stopped)
		relayProc.stop()
		consumerProc.stop()
	}
	// A service that exits on its own ends the measurement with its last
	// words.
	for _, proc := range p.procs {
		go func() {
			select {
			case <-proc.Done():
				select {
				case <-stopped:
				default:
					p.failed <- proc.Exited()
				}
			case <-stopped:
			}
		}()
	}
	return nil
}
