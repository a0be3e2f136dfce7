package demo

import (
	"errors"
	"os"
	"time"
)

// Process is a service run as a real operating-system process that can be
// killed, paused and restarted: the demo's process handling, for other
// fault-injecting harnesses.
type Process struct{ p *proc }

// NewProcess returns a stopped Process running path with args, the current
// environment plus env, and its output appended to logFile.
func NewProcess(name, path string, args, env []string, logFile string) *Process {
	return &Process{p: &proc{name: name, path: path, args: args, env: env, logs: logFile}}
}

// Name returns the name the Process was created with.
func (p *Process) Name() string { return p.p.name }

// Start launches the process.
func (p *Process) Start() error { return p.p.start() }

// Running reports whether the process is alive.
func (p *Process) Running() bool { return p.p.running() }

// Kill sends SIGKILL and waits for the process to die.
func (p *Process) Kill() { p.p.kill() }

// Stop sends SIGTERM and waits up to timeout for a graceful exit, then kills.
func (p *Process) Stop(timeout time.Duration) error { return p.p.stop(timeout) }

// Signal sends sig to the running process (SIGSTOP and SIGCONT pause and
// resume it).
func (p *Process) Signal(sig os.Signal) error {
	p.p.mu.Lock()
	defer p.p.mu.Unlock()
	if p.p.cmd == nil {
		return errors.New(p.p.name + ": not running")
	}
	return p.p.cmd.Process.Signal(sig)
}
