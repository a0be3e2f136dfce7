// Package clitest checks a command's flags against its sources: each
// setting's flag and environment variable are written once.
package clitest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

var (
	envSuffix = regexp.MustCompile(`\(env ([A-Z][A-Z0-9_]*)\)$`)
	// envMention is an environment variable named in parentheses, as help
	// texts used to end.
	envMention = regexp.MustCompile(`\((?:env )?[A-Z][A-Z0-9]*_[A-Z0-9_]+\)`)
	word       = regexp.MustCompile(`[A-Z][A-Z0-9_]+`)
)

// CheckFlags walks root's commands: every flag of a command named run or
// healthcheck, and every other flag naming an environment variable, must
// end its help with "(env NAME)"; no command binds one variable to two
// flags; and no string literal of the non-test Go files in dir names a
// variable a flag of run binds more than once.
func CheckFlags(t *testing.T, root *cobra.Command, dir string) {
	t.Helper()
	runEnvs := map[string]bool{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		bound := map[string]string{}
		visit := func(f *pflag.Flag, local bool) {
			m := envSuffix.FindStringSubmatch(f.Usage)
			if m == nil {
				if local && (c.Name() == "run" || c.Name() == "healthcheck" || envMention.MatchString(f.Usage)) {
					t.Errorf("%s --%s: help does not end (env NAME): %q", c.CommandPath(), f.Name, f.Usage)
				}
				return
			}
			if other, ok := bound[m[1]]; ok {
				t.Errorf("%s: %s is bound to --%s and --%s", c.CommandPath(), m[1], other, f.Name)
			}
			bound[m[1]] = f.Name
			if c.Name() == "run" {
				runEnvs[m[1]] = true
			}
		}
		c.LocalFlags().VisitAll(func(f *pflag.Flag) { visit(f, true) })
		c.InheritedFlags().VisitAll(func(f *pflag.Flag) { visit(f, false) })
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	if len(runEnvs) < 10 {
		t.Fatalf("only %d environment variables found on run", len(runEnvs))
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string][]string{}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, _ := strconv.Unquote(lit.Value)
			for _, w := range word.FindAllString(s, -1) {
				if runEnvs[w] {
					seen[w] = append(seen[w], fset.Position(lit.Pos()).String())
				}
			}
			return true
		})
	}
	for env, at := range seen {
		if len(at) > 1 {
			t.Errorf("%s is spelled %d times: %v; name it from the options table", env, len(at), at)
		}
	}
}
