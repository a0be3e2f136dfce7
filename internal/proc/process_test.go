package proc

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestProcessLifecycle: a process that ends on its own says why; one that is
// killed or stopped is stopped (Stop again is a no-op) and can start again;
// its output goes to the log file, one header per start.
func TestProcessLifecycle(t *testing.T) {
	t.Parallel()
	p := New("quitter", "/bin/sh", []string{"-c", "echo bye; exit 3"}, nil, "")
	require.NoError(t, p.Start())
	select {
	case <-p.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the process did not end")
	}
	require.False(t, p.Running())
	require.ErrorContains(t, p.Exited(), "quitter exited (exit status 3): bye")
	require.ErrorContains(t, p.Stop(time.Second), "exit status 3", "Stop reports how it had ended")
	require.NoError(t, p.Stop(time.Second), "then it is stopped")

	log := filepath.Join(t.TempDir(), "sleeper.log")
	s := New("sleeper", "/bin/sh", []string{"-c", "echo up; exec sleep 30"}, nil, log)
	require.NoError(t, s.Start())
	require.True(t, s.Running())
	require.NoError(t, s.Signal(syscall.SIGSTOP))
	require.NoError(t, s.Signal(syscall.SIGCONT))
	s.Kill()
	require.False(t, s.Running())
	require.NoError(t, s.Stop(time.Second), "a killed process is stopped")
	require.Error(t, s.Signal(syscall.SIGTERM), "nothing to signal")

	require.NoError(t, s.Start(), "started again")
	require.ErrorContains(t, s.Stop(10*time.Second), "signal: terminated", "SIGTERM ends it")
	require.False(t, s.Running())
	b, err := readFile(log)
	require.NoError(t, err)
	require.Contains(t, b, "===== sleeper start #2")
}

func readFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	return string(b), err
}
