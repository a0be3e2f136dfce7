package pgrelay_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/proc"
	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/internal/testnats"
)

// userProgram is a consumer as an application writes it in its own module,
// with nothing but pgrelay's public names: the README's program.
const userProgram = `package main

import (
	"context"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/nats"
	"github.com/pgrelay/pgrelay/consumer"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	c, err := consumer.New(consumer.Config{
		Pool: pool,
		Subscribe: broker.Subscribe(nats.NewSubscriber, nats.Config{
			URL:           os.Getenv("NATS_URL"),
			Stream:        os.Getenv("STREAM"),
			SubjectPrefix: os.Getenv("SUBJECT_PREFIX"),
		}),
		Inbox: pgrelay.InboxConfig{
			Handler: pgrelay.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
				_, err := tx.Exec(ctx, ` + "`" + `INSERT INTO applied (event_id, times) VALUES ($1, 1)
					ON CONFLICT (event_id) DO UPDATE SET times = applied.times + 1` + "`" + `, ev.EventID)
				return err
			}),
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
`

// producerProgram is a producer in its own module: it enqueues one event
// with the root package alone.
const producerProgram = `package main

import (
	"context"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/pgrelay/pgrelay"
)

func main() {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, os.Args[1])
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close(ctx)
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		return pgrelay.Enqueue(ctx, tx, pgrelay.Message{Topic: "orders", Key: "o-1", EventType: "OrderCreated",
			Payload: []byte(` + "`{}`" + `)})
	})
	if err != nil {
		log.Fatal(err)
	}
}
`

// userModule writes files (path → contents) into a new module that requires
// pgrelay, replaced by this tree, and returns its directory.
func userModule(t *testing.T, files map[string]string) string {
	t.Helper()
	_, self, _, _ := runtime.Caller(0)
	repo := filepath.Dir(self)
	dir := t.TempDir()
	gomod := "module example.com/app\n\ngo 1.26.0\n\nrequire github.com/pgrelay/pgrelay v0.0.0-00010101000000-000000000000\n\n" +
		"replace github.com/pgrelay/pgrelay => " + repo + "\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod), 0o644))
	for name, body := range files {
		require.NoError(t, os.MkdirAll(filepath.Join(dir, filepath.Dir(name)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644))
	}
	return dir
}

// buildProgram builds the package pkg of the module in dir and returns the
// binary's path.
func buildProgram(t *testing.T, dir, pkg string) string {
	t.Helper()
	bin := filepath.Join(dir, pkg+".bin")
	require.NoError(t, proc.Build(context.Background(), proc.BuildSpec{Dir: dir, Out: bin, Packages: []string{"./" + pkg},
		Env: []string{"GOFLAGS=-mod=mod", "GOWORK=off"}}), "go build of the user's %s", pkg)
	return bin
}

// TestProgramInAnotherModule builds a producer and a consumer in a module of
// their own that imports pgrelay (replaced by this tree) and uses only public
// names, runs them against the real database and NATS: the producer enqueues
// an event; the consumer is delivered every event twice and its handler
// applies each exactly once.
func TestProgramInAnotherModule(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a program with the go command")
	}
	dbURL := testdb.NewURL(t)
	natsURL := testnats.URL(t)
	stream, prefix := testnats.Stream(t, natsURL)

	dir := userModule(t, map[string]string{"app/main.go": userProgram, "producer/main.go": producerProgram})
	bin := buildProgram(t, dir, "app")
	producer := buildProgram(t, dir, "producer")

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	defer pool.Close()
	_, err = pool.Exec(ctx, `CREATE TABLE applied (event_id text PRIMARY KEY, times int NOT NULL)`)
	require.NoError(t, err)

	app := exec.Command(bin)
	app.Env = append(os.Environ(), "DATABASE_URL="+dbURL, "NATS_URL="+natsURL, "STREAM="+stream, "SUBJECT_PREFIX="+prefix)
	logFile, err := os.Create(filepath.Join(dir, "app.log"))
	require.NoError(t, err)
	defer logFile.Close()
	app.Stdout, app.Stderr = logFile, logFile
	logs := func() string { b, _ := os.ReadFile(logFile.Name()); return string(b) }
	require.NoError(t, app.Start())
	exited := make(chan error, 1)
	go func() { exited <- app.Wait() }()
	defer func() {
		_ = app.Process.Kill()
	}()

	// The producer-only program: it enqueues with pgrelay alone.
	out, err := exec.CommandContext(ctx, producer, dbURL).CombinedOutput()
	require.NoError(t, err, "the producer program: %s", out)
	var enqueued int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pgrelay.outbox WHERE topic = 'orders' AND event_type = 'OrderCreated'`).Scan(&enqueued))
	require.Equal(t, 1, enqueued, "the producer program enqueued its event")

	_, js := testnats.Connect(t, natsURL)
	const events = 20
	for round := range 2 { // the second round: redeliveries under new broker ids
		for i := range events {
			m := nats.NewMsg(prefix + ".orders")
			m.Header.Set("Nats-Msg-Id", fmt.Sprintf("m-%d-%d", i, round))
			m.Header.Set("Pgrelay-Event-Id", fmt.Sprintf("e-%d", i))
			m.Header.Set("Pgrelay-Event-Type", "OrderCreated")
			m.Data = []byte(`{}`)
			_, err := js.PublishMsg(ctx, m)
			require.NoError(t, err)
		}
	}

	deadline := time.Now().Add(time.Minute)
	for processed := 0; processed < events; time.Sleep(50 * time.Millisecond) {
		require.True(t, time.Now().Before(deadline), "the user's consumer never processed the events; its logs:\n%s", logs())
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM pgrelay.inbox WHERE status = 'processed'`).Scan(&processed)
	}

	require.NoError(t, app.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		require.NoError(t, err, "the user's consumer exited badly; its logs:\n%s", logs())
	case <-time.After(30 * time.Second):
		t.Fatalf("the user's consumer did not stop on SIGTERM; its logs:\n%s", logs())
	}

	var rows, applied, maxTimes int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(times), 0), coalesce(max(times), 0) FROM applied`).
		Scan(&rows, &applied, &maxTimes))
	require.Equal(t, events, rows, "every event applied")
	require.Equal(t, 1, maxTimes, "no event applied twice")
	var inboxRows int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pgrelay.inbox`).Scan(&inboxRows))
	require.Equal(t, events, inboxRows, "each duplicate delivery stored once")
}
