package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/pgrelay/pgrelay/internal/proc"
)

// binaries are the relay and consumer commands, built for the run (or given
// with -bin) so that the end-to-end and cost figures measure real processes.
type binaries struct {
	relay, consumer string
	tmp             string
}

// buildBinaries builds ./cmd/relay and ./cmd/consumer into a temporary
// directory, or uses the ones in dir when it is set.
func buildBinaries(ctx context.Context, dir string) (*binaries, error) {
	if dir != "" {
		b := &binaries{relay: filepath.Join(dir, "relay"), consumer: filepath.Join(dir, "consumer")}
		for _, p := range []string{b.relay, b.consumer} {
			if _, err := os.Stat(p); err != nil {
				return nil, fmt.Errorf("-bin: %w", err)
			}
		}
		return b, nil
	}
	tmp, err := os.MkdirTemp("", "pgrelay-bench-bin-")
	if err != nil {
		return nil, err
	}
	b := &binaries{relay: filepath.Join(tmp, "relay"), consumer: filepath.Join(tmp, "consumer"), tmp: tmp}
	if err := proc.Build(ctx, proc.BuildSpec{Out: tmp + string(os.PathSeparator), Packages: []string{"./cmd/relay", "./cmd/consumer"}}); err != nil {
		b.remove()
		return nil, fmt.Errorf("%s", firstLine(err.Error()))
	}
	return b, nil
}

func (b *binaries) remove() {
	if b != nil && b.tmp != "" {
		os.RemoveAll(b.tmp)
	}
}

// process is a service started for a measurement.
type process struct{ *proc.Process }

func startProcess(name, path string, args, env []string) (*process, error) {
	p := proc.New(name, path, args, env, "")
	if err := p.Start(); err != nil {
		return nil, err
	}
	return &process{p}, nil
}

// stop sends SIGTERM and waits for a graceful exit, killing the process
// after 20 s.
func (p *process) stop() { _ = p.Stop(20 * time.Second) }

// cpuSeconds returns the user and system CPU time the process has used so
// far, from /proc/<pid>/stat.
func (p *process) cpuSeconds() (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Pid()))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; the fields after it start
	// behind the last ')'.
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 13 {
		return 0, errors.New("short /proc stat line")
	}
	utime, err1 := strconv.ParseFloat(fields[11], 64)
	stime, err2 := strconv.ParseFloat(fields[12], 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return (utime + stime) / clockTicks, nil
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times: 100 on Linux.
const clockTicks = 100

// peakRSS returns the process's peak resident set (VmHWM), in MiB.
func (p *process) peakRSS() (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.Pid()))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 64)
			if err != nil {
				return 0, err
			}
			return kb / 1024, nil
		}
	}
	return 0, errors.New("no VmHWM in /proc status")
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
