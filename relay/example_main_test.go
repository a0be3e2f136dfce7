package relay_test

import (
	"testing"

	"github.com/pgrelay/pgrelay/internal/exampleenv"
)

// TestMain gives the Example functions a migrated database of their own and a
// NATS server (internal/exampleenv).
func TestMain(m *testing.M) { exampleenv.Main(m, true) }
