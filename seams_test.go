package pgrelay_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const mod = "github.com/pgrelay/pgrelay"

// engines are the packages that do the work behind the public surface and
// that an adapter or the metrics must not pull in: the relay (its engine and
// WAL capture) and the consumer (its ingest engine). The inbox and outbox
// engines live in the root package, the public types every part imports.
var engines = []string{mod + "/relay", mod + "/consumer"}

// goListImports returns, for each package pattern matches, the packages it
// imports itself (not its tests').
func goListImports(t *testing.T, pattern string) map[string][]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, pattern).CombinedOutput()
	require.NoError(t, err, "go list %s: %s", pattern, out)
	imports := map[string][]string{}
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		imports[f[0]] = f[1:]
	}
	return imports
}

// assertNoImports fails for each package of pattern that imports one of
// forbidden, unless allowed[pkg] lists it.
func assertNoImports(t *testing.T, pattern string, forbidden []string, allowed map[string][]string) {
	t.Helper()
	for pkg, imps := range goListImports(t, pattern) {
		for _, imp := range imps {
			for _, f := range forbidden {
				if imp == f && !contains(allowed[pkg], imp) {
					t.Errorf("%s imports %s", pkg, imp)
				}
			}
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestSeams: the arrows between the parts point one way. Broker adapters
// implement the broker seam and import no engine (broker/postgres stores into
// the inbox through the root package's receive path); metrics implement the
// engines' observers structurally and import none; the consumer's ingest
// (package consumer) imports no broker adapter: a direct consumer is given
// its registration (Config.Register); a consumer program does not link WAL
// capture.
func TestSeams(t *testing.T) {
	t.Parallel()
	t.Run("broker imports no engine", func(t *testing.T) {
		assertNoImports(t, mod+"/broker/...", engines, nil)
	})
	t.Run("metrics import no engine", func(t *testing.T) {
		// The root package is the public types (the inbox's observers name
		// *pgrelay.InboxEvent) and the inbox engine every consumer links
		// anyway; the relay (WAL capture) and the consumer engine are not.
		assertNoImports(t, mod+"/internal/metrics", engines, nil)
	})
	t.Run("consumer engine imports no broker adapter", func(t *testing.T) {
		adapters := []string{mod + "/broker/nats", mod + "/broker/kafka", mod + "/broker/rabbitmq", mod + "/broker/postgres"}
		assertNoImports(t, mod+"/consumer", adapters, nil)
	})
	t.Run("a consumer does not link WAL capture", func(t *testing.T) {
		for _, pkg := range []string{mod + "/cmd/consumer", mod + "/consumer"} {
			for _, d := range goListDeps(t, pkg) {
				require.NotEqual(t, "github.com/jackc/pglogrepl", d, "%s links WAL capture", pkg)
			}
		}
	})
}
