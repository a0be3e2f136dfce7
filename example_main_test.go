package pgrelay_test

import (
	"os"
	"testing"

	"github.com/pgrelay/pgrelay/internal/exampleenv"
)

// TestMain gives the Example functions a migrated database of their own (internal/exampleenv).
// TestMain runs a child process of a crash test when asked to (the inbox
// worker's roles, the causation hop), else the tests and the examples.
func TestMain(m *testing.M) {
	if role := os.Getenv(childRoleEnv); role != "" {
		os.Exit(runChild(role, os.Getenv(childDBEnv)))
	}
	if os.Getenv(hopChildEnv) == "1" {
		os.Exit(runHopChild())
	}
	exampleenv.Main(m, false)
}
