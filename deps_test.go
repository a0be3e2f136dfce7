package pgrelay_test

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// heavy are the modules the root package must never depend on: broker
// clients, the embedded NATS server, the CLI, the console and the metrics
// library. They belong to the opt-in packages (broker/..., consumer, relay,
// the commands).
var heavy = []string{
	"github.com/nats-io/nats-server",
	"github.com/nats-io/nats.go",
	"github.com/twmb/franz-go",
	"github.com/rabbitmq/amqp091-go",
	"github.com/spf13/cobra",
	"github.com/charmbracelet/bubbletea",
	"github.com/prometheus/client_golang",
	"go.opentelemetry.io", // tracing is opt-in: package otelpgrelay
}

// goListDeps returns the packages pkg depends on (go list -deps).
func goListDeps(t *testing.T, pkg string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "list", "-deps", pkg).CombinedOutput()
	require.NoError(t, err, "go list -deps %s: %s", pkg, out)
	return strings.Fields(string(out))
}

// TestRootDependencies: importing pgrelay costs pgx and the standard
// library, not a broker client, a CLI or a metrics library.
func TestRootDependencies(t *testing.T) {
	deps := goListDeps(t, "github.com/pgrelay/pgrelay")
	for _, d := range deps {
		for _, h := range heavy {
			require.False(t, strings.HasPrefix(d, h), "the root package depends on %s (via %s)", h, d)
		}
	}
	t.Logf("go list -deps github.com/pgrelay/pgrelay: %d packages", len(deps))
}

// TestOptInDependencies: each opt-in package carries only what it is for:
// the consumer no broker client, CLI or console; an adapter its own client
// alone (broker/nats not the NATS server).
func TestOptInDependencies(t *testing.T) {
	for pkg, forbidden := range map[string][]string{
		"github.com/pgrelay/pgrelay/consumer": {"github.com/nats-io/", "github.com/twmb/franz-go", "github.com/rabbitmq/amqp091-go",
			"github.com/spf13/cobra", "github.com/spf13/pflag", "github.com/charmbracelet/bubbletea"},
		"github.com/pgrelay/pgrelay/relay": {"github.com/nats-io/", "github.com/twmb/franz-go", "github.com/rabbitmq/amqp091-go",
			"github.com/spf13/cobra", "github.com/charmbracelet/bubbletea"},
		"github.com/pgrelay/pgrelay/broker": {"github.com/nats-io/", "github.com/twmb/franz-go", "github.com/rabbitmq/amqp091-go",
			"github.com/prometheus/client_golang", "github.com/spf13/cobra"},
		"github.com/pgrelay/pgrelay/broker/nats": {"github.com/nats-io/nats-server", "github.com/twmb/franz-go",
			"github.com/rabbitmq/amqp091-go", "github.com/prometheus/client_golang", "github.com/spf13/cobra"},
		"github.com/pgrelay/pgrelay/broker/kafka": {"github.com/nats-io/", "github.com/rabbitmq/amqp091-go",
			"github.com/prometheus/client_golang", "github.com/spf13/cobra"},
		"github.com/pgrelay/pgrelay/broker/rabbitmq": {"github.com/nats-io/", "github.com/twmb/franz-go",
			"github.com/prometheus/client_golang", "github.com/spf13/cobra"},
	} {
		deps := goListDeps(t, pkg)
		for _, d := range deps {
			for _, f := range forbidden {
				require.False(t, strings.HasPrefix(d, f), "%s depends on %s (via %s)", pkg, f, d)
			}
		}
		t.Logf("go list -deps %s: %d packages", pkg, len(deps))
	}
}

// pgxOnlyProgram writes an outbox row with pgx alone: the floor the
// enqueue-only program is compared with.
const pgxOnlyProgram = `package main

import (
	"context"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
)

func main() {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, os.Args[1])
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close(ctx)
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO pgrelay.outbox (event_id, topic, key, event_type, payload) VALUES ($1, $2, $3, $4, $5)",
			"e-1", "orders", "o-1", "OrderCreated", []byte("{}"))
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
}
`

// TestEnqueueProgramSize: a program whose only pgrelay call is Enqueue is at
// most 1.1× the size of the same program writing the row with pgx alone.
func TestEnqueueProgramSize(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two programs with the go command")
	}
	dir := userModule(t, map[string]string{"pgxonly/main.go": pgxOnlyProgram, "producer/main.go": producerProgram})
	size := func(pkg string) int64 {
		fi, err := os.Stat(buildProgram(t, dir, pkg))
		require.NoError(t, err)
		return fi.Size()
	}
	floor, enqueue := size("pgxonly"), size("producer")
	ratio := float64(enqueue) / float64(floor)
	t.Logf("pgx alone: %d bytes; pgrelay.Enqueue: %d bytes; ratio %.2f", floor, enqueue, ratio)
	require.LessOrEqual(t, ratio, 1.1, "an enqueue-only program is %.2f× the pgx-only one (%d vs %d bytes)", ratio, enqueue, floor)
}

// TestRootDeclaresNoAliases: the root's types are its own, documented where
// go doc shows them, not aliases of internal types.
func TestRootDeclaresNoAliases(t *testing.T) {
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		require.NoError(t, err)
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.TYPE {
				continue
			}
			for _, s := range g.Specs {
				ts := s.(*ast.TypeSpec)
				require.False(t, ts.Assign.IsValid(), "%s: type %s is an alias", fset.Position(ts.Pos()), ts.Name.Name)
			}
		}
	}
}
