package proc

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Process is a service run as a real operating-system process, so that it
// can be stopped with SIGTERM, killed with SIGKILL, paused with SIGSTOP and
// started again, as in production.
type Process struct {
	name string
	path string
	args []string
	env  []string
	log  string // file the output is appended to; "" keeps its tail in memory

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	err  error // the exit error, once done is closed
	tail *tailBuffer
	runs int
}

// New returns a stopped Process running path with args and the current
// environment plus env. Its output is appended to the file logFile, or, when
// logFile is empty, its last 8 KiB are kept (Output).
func New(name, path string, args, env []string, logFile string) *Process {
	return &Process{name: name, path: path, args: args, env: env, log: logFile, tail: &tailBuffer{max: 8 << 10}}
}

// Name returns the name the Process was created with.
func (p *Process) Name() string { return p.name }

// Start launches the process.
func (p *Process) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out io.Writer = p.tail
	var f *os.File
	if p.log != "" {
		var err error
		if f, err = os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err != nil {
			return fmt.Errorf("%s: log file: %w", p.name, err)
		}
		out = f
	}
	p.runs++
	if f != nil {
		fmt.Fprintf(f, "\n===== %s start #%d at %s =====\n", p.name, p.runs, time.Now().Format(time.RFC3339Nano))
	}
	cmd := exec.Command(p.path, p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		if f != nil {
			f.Close()
		}
		return fmt.Errorf("%s: start %s: %w", p.name, p.path, err)
	}
	done := make(chan struct{})
	go func() {
		err := cmd.Wait()
		if f != nil {
			f.Close()
		}
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(done)
	}()
	p.cmd, p.done = cmd, done
	return nil
}

// Running reports whether the process is alive.
func (p *Process) Running() bool {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// Exited returns, once the process has ended, why (its exit status and last
// line of output); nil while it runs or before it started.
func (p *Process) Exited() error {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done == nil {
		return nil
	}
	select {
	case <-done:
		p.mu.Lock()
		defer p.mu.Unlock()
		return fmt.Errorf("%s exited (%v): %s", p.name, p.err, lastLine(p.tail.String()))
	default:
		return nil
	}
}

// Done returns a channel closed when the process started last ends (nil
// before Start).
func (p *Process) Done() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

// Pid returns the running process's id, or 0.
func (p *Process) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Output returns the end of the process's output when it is kept in memory
// (New without a log file).
func (p *Process) Output() string { return p.tail.String() }

// Kill sends SIGKILL and waits for the process to die: a crash at an
// arbitrary point. The Process is then stopped: Start runs it again.
func (p *Process) Kill() {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-done
	p.forget(cmd)
}

// Stop sends SIGTERM, waits up to timeout for a graceful exit, then kills.
// It returns the process's exit error (also when it had ended on its own);
// a stopped or killed Process returns nil.
func (p *Process) Stop(timeout time.Duration) error {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return nil
	}
	defer p.forget(cmd)
	select {
	case <-done:
		return p.exitErr() // it had already ended
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
		return p.exitErr()
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("%s did not stop within %s after SIGTERM; killed", p.name, timeout)
	}
}

func (p *Process) exitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// forget marks the Process stopped, unless it was started again meanwhile.
func (p *Process) forget(cmd *exec.Cmd) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == cmd {
		p.cmd, p.done = nil, nil
	}
}

// Signal sends sig to the process (SIGSTOP and SIGCONT pause and resume
// it).
func (p *Process) Signal(sig os.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return errors.New(p.name + ": not running")
	}
	return p.cmd.Process.Signal(sig)
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

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
