package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
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
	for _, target := range []struct{ out, pkg string }{{b.relay, "./cmd/relay"}, {b.consumer, "./cmd/consumer"}} {
		cmd := exec.CommandContext(ctx, "go", "build", "-o", target.out, target.pkg)
		cmd.Dir = moduleRoot()
		if out, err := cmd.CombinedOutput(); err != nil {
			b.remove()
			return nil, fmt.Errorf("go build %s: %v: %s", target.pkg, err, firstLine(string(out)))
		}
	}
	return b, nil
}

func (b *binaries) remove() {
	if b != nil && b.tmp != "" {
		os.RemoveAll(b.tmp)
	}
}

// moduleRoot finds the directory holding go.mod, from the working directory
// up (the benchmark runs from the repository root or from bench/ in tests).
func moduleRoot() string {
	dir, _ := os.Getwd()
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			return dir
		}
	}
}

// process is a service started for a measurement.
type process struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
	out  *tailBuffer
}

func startProcess(name, path string, args, env []string) (*process, error) {
	p := &process{name: name, done: make(chan struct{}), out: &tailBuffer{max: 8 << 10}}
	p.cmd = exec.Command(path, args...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// exited returns why the process ended, or nil while it runs.
func (p *process) exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("%s exited (%v): %s", p.name, p.err, lastLine(p.out.String()))
	default:
		return nil
	}
}

// stop sends SIGTERM and waits for a graceful exit, killing the process
// after 20 s.
func (p *process) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// cpuSeconds returns the user and system CPU time the process has used so
// far, from /proc/<pid>/stat.
func (p *process) cpuSeconds() (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
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
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
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

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	max int
}

func (t *tailBuffer) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf.Write(b)
	if over := t.buf.Len() - t.max; over > 0 {
		t.buf.Next(over)
	}
	return len(b), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.buf.String()
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
