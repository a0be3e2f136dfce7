package pgrelay_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestArchitectureNamesEveryPackage: docs/architecture.md's package map names
// every package of the library's module and of the modules beside it
// (integration, integration/chaos, bench, deploy/helm), as `path`, `path/` or, under
// internal/, by the path below it.
func TestArchitectureNamesEveryPackage(t *testing.T) {
	doc, err := os.ReadFile("docs/architecture.md")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var pkgs []string
	for _, dir := range []string{".", "integration", "integration/chaos", "bench", "deploy/helm"} {
		out, err := exec.CommandContext(ctx, "go", "list", "./...").Output()
		if dir != "." {
			out, err = exec.CommandContext(ctx, "go", "-C", dir, "list", "./...").Output()
		}
		require.NoError(t, err, "go list in %s", dir)
		pkgs = append(pkgs, strings.Fields(string(out))...)
	}
	var missing []string
	for _, p := range pkgs {
		rel := strings.TrimPrefix(strings.TrimPrefix(p, "github.com/pgrelay/pgrelay"), "/")
		if rel == "" {
			continue // the root: "/ (package pgrelay)"
		}
		names := []string{"`" + rel + "`", "`" + rel + "/`"}
		if r, ok := strings.CutPrefix(rel, "internal/"); ok {
			names = append(names, "`"+r+"`")
		}
		found := false
		for _, n := range names {
			found = found || strings.Contains(string(doc), n)
		}
		if !found {
			missing = append(missing, rel)
		}
	}
	require.Empty(t, missing, "docs/architecture.md does not name these packages")
}

// TestDocsStayUnder450KB: the manual (docs/*.md) is one page per topic with no
// history (that is the CHANGELOG's); its total stays under 450,000 bytes.
func TestDocsStayUnder450KB(t *testing.T) {
	pages, err := filepath.Glob("docs/*.md")
	require.NoError(t, err)
	total := 0
	for _, p := range pages {
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		total += len(b)
	}
	require.Less(t, total, 450_000, "docs/*.md total %d bytes", total)
	t.Logf("docs/*.md: %d pages, %d bytes", len(pages), total)
}
