package demo

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

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
