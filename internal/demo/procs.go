package demo

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// proc is one service the demo runs as a real operating-system process, so
// that it can be killed with SIGKILL and restarted like in production.
type proc struct {
	name string
	path string
	args []string
	env  []string
	logs string // file the process's output is appended to

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan error
	runs int
}

// start launches the process. Its output is appended to p.logs.
func (p *proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	f, err := os.OpenFile(p.logs, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("%s: log file: %w", p.name, err)
	}
	p.runs++
	fmt.Fprintf(f, "\n===== %s start #%d at %s =====\n", p.name, p.runs, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(p.path, p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("%s: start %s: %w", p.name, p.path, err)
	}
	done := make(chan error, 1)
	go func() {
		done <- cmd.Wait()
		f.Close()
	}()
	p.cmd, p.done = cmd, done
	return nil
}

// running reports whether the process is alive.
func (p *proc) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	select {
	case err := <-p.done:
		p.done <- err // keep it for stop/kill
		return false
	default:
		return true
	}
}

// kill sends SIGKILL and waits for the process to die: a crash at an
// arbitrary point.
func (p *proc) kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	p.cmd = nil
}

// stop sends SIGTERM, waits up to timeout for a graceful exit, then kills.
// It returns the process's exit error after a graceful stop.
func (p *proc) stop(timeout time.Duration) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return nil
	}
	defer func() { p.cmd = nil }()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		return err
	case <-time.After(timeout):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("%s did not stop within %s after SIGTERM; killed", p.name, timeout)
	}
}

// findBinary locates a service binary: in dir when given, else next to the
// running executable, else on PATH.
func findBinary(dir, name string) (string, error) {
	var candidates []string
	if dir != "" {
		candidates = append(candidates, filepath.Join(dir, name))
	} else if exe, err := os.Executable(); err == nil {
		candidates = append(candidates, filepath.Join(filepath.Dir(exe), name))
	}
	for _, c := range candidates {
		if st, err := os.Stat(c); err == nil && !st.IsDir() {
			return c, nil
		}
	}
	if dir == "" {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("cannot find the %s binary (looked in %v and PATH); build it with `make build` or pass --bin-dir", name, candidates)
}

// runOnce runs a command to completion (migrations), returning its output on
// failure.
func runOnce(ctx context.Context, path string, env []string, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return errors.Join(fmt.Errorf("%s %v: %w", filepath.Base(path), args, err), errors.New(string(out)))
	}
	return nil
}
