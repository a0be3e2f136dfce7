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
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	c, err := pgrelay.NewConsumer(pgrelay.ConsumerConfig{
		Pool:          pool,
		NATSURL:       os.Getenv("NATS_URL"),
		Stream:        os.Getenv("STREAM"),
		SubjectPrefix: os.Getenv("SUBJECT_PREFIX"),
		Handler: pgrelay.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
			_, err := tx.Exec(ctx, ` + "`" + `INSERT INTO applied (event_id, times) VALUES ($1, 1)
				ON CONFLICT (event_id) DO UPDATE SET times = applied.times + 1` + "`" + `, ev.EventID)
			return err
		}),
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
`

// TestProgramInAnotherModule builds a consumer in a module of its own that
// imports pgrelay (replaced by this tree) and uses only public names, runs it
// against the real database and NATS, delivers every event twice and checks
// that its handler applied each exactly once.
func TestProgramInAnotherModule(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a program with the go command")
	}
	dbURL := testdb.NewURL(t)
	natsURL := testnats.URL(t)
	stream, prefix := testnats.Stream(t, natsURL)

	_, self, _, _ := runtime.Caller(0)
	repo := filepath.Dir(self)
	dir := t.TempDir()
	gomod := "module example.com/app\n\ngo 1.26.0\n\nrequire github.com/pgrelay/pgrelay v0.0.0-00010101000000-000000000000\n\n" +
		"replace github.com/pgrelay/pgrelay => " + repo + "\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte(userProgram), 0o644))
	bin := filepath.Join(dir, "app")
	require.NoError(t, proc.Build(context.Background(), proc.BuildSpec{Dir: dir, Out: bin, Packages: []string{"."},
		Env: []string{"GOFLAGS=-mod=mod", "GOWORK=off"}}), "go build of the user's module")

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
