// Package proc builds pgrelay's commands and runs them as operating-system
// processes: the one builder of the tests, the fault suite and the benchmark
// (Build, Binaries), and the one supervisor of the demo, the fault suite and
// the benchmark (Process: start, SIGTERM with a deadline, SIGKILL, SIGSTOP,
// output kept in a file or in memory).
package proc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// ModuleRoot returns the directory holding pgrelay's go.mod, the library's
// module: `go list -m` from the working directory finds it both inside that
// module (the library's tests) and inside the modules that require it with a
// replace directive to a directory (integration/, integration/chaos, bench).
func ModuleRoot(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "github.com/pgrelay/pgrelay").Output()
	if err != nil {
		return "", fmt.Errorf("go list -m github.com/pgrelay/pgrelay: %w", err)
	}
	dir := strings.TrimSpace(string(out))
	if dir == "" {
		return "", errors.New("not inside the pgrelay module or a module that replaces it with a directory")
	}
	return dir, nil
}

// BuildSpec is one go build.
type BuildSpec struct {
	// Dir is where go build runs. Default: the module root.
	Dir string
	// Out is the output: a directory when it ends with a path separator
	// (one binary per package, named after it), else the binary's path.
	Out string
	// Packages are the packages to build, relative to Dir, as "./cmd/relay".
	Packages []string
	// Env is added to the environment of go build.
	Env []string
}

// Build runs one go build of spec, bounded by ten minutes; its error holds the
// compiler's output.
func Build(ctx context.Context, spec BuildSpec) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	if spec.Dir == "" {
		root, err := ModuleRoot(ctx)
		if err != nil {
			return err
		}
		spec.Dir = root
	}
	cmd := exec.CommandContext(ctx, "go", append([]string{"build", "-o", spec.Out}, spec.Packages...)...)
	cmd.Dir = spec.Dir
	cmd.Env = append(os.Environ(), spec.Env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", strings.Join(spec.Packages, " "), err, out)
	}
	return nil
}

// Binaries builds commands of the module into a temporary directory once,
// for all the tests of a test binary that run them as processes.
type Binaries struct {
	packages []string
	once     sync.Once
	dir      string
	err      error
}

// NewBinaries returns the Binaries of packages ("./cmd/relay", ...), not yet
// built.
func NewBinaries(packages ...string) *Binaries { return &Binaries{packages: packages} }

// TB is the part of testing.TB that Dir uses (the demo's binary does not
// link the testing package).
type TB interface {
	Helper()
	Fatal(args ...any)
}

// Dir builds the binaries on its first call (the others wait for it) and
// returns their directory; a failed build fails t.
func (b *Binaries) Dir(t TB) string {
	t.Helper()
	dir, err := b.Build(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// Build is Dir for callers without a testing.TB: it builds once and returns
// the directory, or the build's error.
func (b *Binaries) Build(ctx context.Context) (string, error) {
	b.once.Do(func() {
		if b.dir, b.err = os.MkdirTemp("", "pgrelay-bin-"); b.err != nil {
			return
		}
		b.err = Build(ctx, BuildSpec{Out: b.dir + string(os.PathSeparator), Packages: b.packages})
	})
	return b.dir, b.err
}

// Remove deletes the built binaries (from TestMain, after the tests).
func (b *Binaries) Remove() {
	if b.dir != "" {
		_ = os.RemoveAll(b.dir)
	}
}
