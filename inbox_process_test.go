package pgrelay_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/inboxtest"
	"github.com/pgrelay/pgrelay/internal/ledger"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// Worker processes for the crash tests are this test binary re-executed with
// childRoleEnv naming what to do and childDBEnv the database.
const (
	childRoleEnv = "PGRELAY_INBOX_TEST_CHILD"
	childDBEnv   = "PGRELAY_INBOX_TEST_DB"
)

// runChild runs a worker process. Roles:
//   - crash-before-commit: handles events with the ledger, printing each, and
//     SIGKILLs itself in the handler of event "killer", after the events
//     before it in the batch returned but before the batch commits.
//   - poison-killer: like crash-before-commit with one worker goroutine and
//     MaxAttempts 3; exits 0 once the inbox holds nothing pending or
//     processing.
//   - worker: handles events with the ledger, printing "handled <id>" for each,
//     until SIGTERM (graceful stop, exit 0).
func runChild(role, dbURL string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	defer pool.Close()
	var out sync.Mutex
	say := func(format string, args ...any) {
		out.Lock()
		defer out.Unlock()
		fmt.Fprintf(os.Stdout, format+"\n", args...)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	h := pgrelay.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
		if ev.EventID == "killer" && role != "worker" {
			say("killing myself at attempt %d", ev.Attempts)
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // never returns
		}
		if err := (ledger.Handler{}).Handle(ctx, tx, ev); err != nil {
			return err
		}
		say("handled %s", ev.EventID)
		return nil
	})
	cfg := pgrelay.InboxConfig{
		Pool: pool, Handler: h, Logger: logger, WorkerID: fmt.Sprintf("child-%s-%d", role, os.Getpid()),
		Workers: 2, BatchSize: 20, Lease: time.Second, HandlerTimeout: 500 * time.Millisecond,
		MaxAttempts: 5, BackoffMin: 5 * time.Millisecond, BackoffMax: 20 * time.Millisecond,
		PollInterval: 20 * time.Millisecond,
	}
	if role == "crash-before-commit" {
		// One claiming goroutine: two claims running at once can split the
		// two events between them (each skips the row the other locked), and
		// the kill may then come before the other batch ran pay-1.
		cfg.Workers = 1
	}
	if role == "poison-killer" {
		cfg.Workers, cfg.MaxAttempts, cfg.Lease, cfg.HandlerTimeout = 1, 3, 300*time.Millisecond, 200*time.Millisecond
		runCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() {
			for runCtx.Err() == nil {
				var n int
				if err := pool.QueryRow(runCtx, `SELECT count(*) FROM pgrelay.inbox WHERE status IN ('pending', 'processing')`).Scan(&n); err == nil && n == 0 {
					cancel()
					return
				}
				select {
				case <-runCtx.Done():
				case <-time.After(20 * time.Millisecond):
				}
			}
		}()
		ctx = runCtx
	}
	w, err := pgrelay.NewInboxWorker(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	if err := w.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	return 0
}

// child is a running worker process.
type child struct {
	cmd    *exec.Cmd
	lines  chan string
	stderr *bytes.Buffer
	done   chan struct{}
	err    error
}

func startChild(t *testing.T, role, dbURL string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childRoleEnv+"="+role, childDBEnv+"="+dbURL)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	c := &child{cmd: cmd, lines: make(chan string, 100000), stderr: &bytes.Buffer{}, done: make(chan struct{})}
	cmd.Stderr = c.stderr
	require.NoError(t, cmd.Start())
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		_, _ = io.Copy(io.Discard, stdout)
		c.err = cmd.Wait()
		close(c.lines)
		close(c.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-c.done
		if t.Failed() {
			t.Logf("child %s stderr:\n%s", role, c.stderr.String())
		}
	})
	return c
}

// wait waits for the child to exit and reports whether a signal killed it.
func (c *child) wait(t *testing.T, within time.Duration) (killed bool) {
	t.Helper()
	select {
	case <-c.done:
	case <-time.After(within):
		t.Fatalf("child did not exit within %s", within)
	}
	var ee *exec.ExitError
	if errors.As(c.err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return ws.Signal() == syscall.SIGKILL
		}
		t.Fatalf("child failed: %v\n%s", c.err, c.stderr.String())
	}
	return false
}

// TestCrashBeforeCommit: a handler returns after inserting its credit, then the
// process dies before the batch commits (the next handler of the batch kills
// it). Nothing of the batch survives; after the lease expires another worker
// takes the events over and credits each exactly once.
func TestCrashBeforeCommit(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	createOrders(t, pool, "o1")
	receive(t, pool, orderPaid("pay-1", "o1", 100))
	receive(t, pool, orderPaid("killer", "o1", 5)) // later next_attempt_at: second in the batch

	c := startChild(t, "crash-before-commit", url)
	require.True(t, c.wait(t, 30*time.Second), "the child must die by SIGKILL")
	var seen []string
	for l := range c.lines {
		seen = append(seen, l)
	}
	require.Equal(t, []string{"handled pay-1", "killing myself at attempt 1"}, seen)

	// The handler's insert died with the transaction; the claims stay.
	require.Zero(t, entries(t, pool, "pay-1"))
	require.Equal(t, row{Status: "processing", Attempts: 1}, inboxRow(t, pool, "pay-1"))

	startWorker(t, fastConfig(t, pool, ledger.Handler{}))
	waitAllDone(t, pool, 15*time.Second)
	for _, id := range []string{"pay-1", "killer"} {
		r := inboxRow(t, pool, id)
		require.Equal(t, "processed", r.Status, id)
		require.Equal(t, 2, r.Attempts, id)
		require.Equal(t, 1, entries(t, pool, id), id)
	}
}

// TestWorkerKilledMidBatch SIGKILLs a worker process in the middle of a run
// over 500 events; a new worker finishes the job and every event is credited
// exactly once.
func TestWorkerKilledMidBatch(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	createOrders(t, pool, "o1")
	var msgs []pgrelay.Incoming
	for _, id := range ids("pay", 500) {
		msgs = append(msgs, orderPaid(id, "o1", 1))
	}
	receive(t, pool, msgs...)

	c := startChild(t, "worker", url)
	for n := 0; n < 150; n++ {
		select {
		case _, ok := <-c.lines:
			require.True(t, ok, "child exited early")
		case <-time.After(20 * time.Second):
			t.Fatal("child made no progress")
		}
	}
	require.NoError(t, c.cmd.Process.Kill())
	require.True(t, c.wait(t, 10*time.Second))
	// A statement the child sent just before it died still runs to its end
	// (a claim then commits): count once none of its backends is active.
	require.Eventually(t, func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND state = 'active' AND pid <> pg_backend_pid()`) == 0
	}, 10*time.Second, 10*time.Millisecond)
	credited := queryInt(t, pool, `SELECT count(*) FROM ledger_entries`)
	inFlight := queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox WHERE status = 'processing'`)
	t.Logf("at the kill: %d credited, %d claimed in flight", credited, inFlight)
	require.Less(t, credited, 500)

	stats := &inboxtest.CountingObserver{}
	cfg := fastConfig(t, pool, ledger.Handler{})
	cfg.Observer = stats
	startWorker(t, cfg)
	waitAllDone(t, pool, 30*time.Second)
	require.Equal(t, 500, queryInt(t, pool, `SELECT count(*) FROM ledger_entries`))
	require.Equal(t, 500, queryInt(t, pool, `SELECT count(DISTINCT event_id) FROM ledger_entries`))
	require.Equal(t, 500, queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox WHERE status = 'processed'`))
	require.Equal(t, inFlight, stats.Snapshot().Takeovers, "every lost claim was taken over")
}

// TestProcessKillingPoison: an event whose handler kills the whole process
// every time ends dead after MaxAttempts (3) with the reason, however often
// the process is restarted, and the events that shared its batches are
// processed.
func TestProcessKillingPoison(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	createOrders(t, pool, "o1")
	receive(t, pool, orderPaid("killer", "o1", 1))
	var msgs []pgrelay.Incoming
	for _, id := range ids("ok", 10) {
		msgs = append(msgs, orderPaid(id, "o1", 1))
	}
	receive(t, pool, msgs...)

	kills := 0
	for run := 0; ; run++ {
		require.Less(t, run, 10, "the poison must end dead, not loop")
		c := startChild(t, "poison-killer", url)
		if !c.wait(t, 60*time.Second) {
			break // exited by itself: the inbox drained
		}
		kills++
	}
	require.Equal(t, 3, kills)
	r := inboxRow(t, pool, "killer")
	require.Equal(t, "dead", r.Status)
	require.Equal(t, 3, r.Attempts)
	require.Equal(t, "attempts exhausted: worker lost during attempt 3 of 3", r.LastError)
	require.Zero(t, entries(t, pool, "killer"))
	require.Equal(t, 10, queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox WHERE status = 'processed'`))
	require.Equal(t, 10, queryInt(t, pool, `SELECT count(*) FROM ledger_entries`))
}

// deliveries returns every event of n 1 to 3 times, shuffled, as OrderPaid
// messages over 50 orders.
func deliveries(n int) ([]pgrelay.Incoming, int) {
	var out []pgrelay.Incoming
	for i, id := range ids("pay", n) {
		m := orderPaid(id, fmt.Sprintf("o%d", i%50), 1)
		for range 1 + rand.IntN(3) {
			out = append(out, m)
		}
	}
	rand.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out, len(out)
}

func orderIDs() []string {
	out := make([]string, 50)
	for i := range out {
		out[i] = fmt.Sprintf("o%d", i)
	}
	return out
}

// feed receives the deliveries in batches of 100, as a consumer would.
func feed(t *testing.T, pool *pgxpool.Pool, msgs []pgrelay.Incoming) (inserted, dups int) {
	for i := 0; i < len(msgs); i += 100 {
		res := receive(t, pool, msgs[i:min(i+100, len(msgs))]...)
		inserted += res.Inserted
		dups += len(res.Duplicates)
	}
	return inserted, dups
}

// TestConcurrentWorkers: 8 worker goroutines over 10,000 events each
// delivered 1 to 3 times, received while the workers run: exactly 10,000
// ledger entries and every inbox row processed.
func TestConcurrentWorkers(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	createOrders(t, pool, orderIDs()...)
	stats := &inboxtest.CountingObserver{}
	cfg := fastConfig(t, pool, ledger.Handler{})
	cfg.Workers, cfg.BatchSize, cfg.Observer = 8, 50, stats
	cfg.Logger = nil
	startWorker(t, cfg)

	msgs, total := deliveries(10000)
	start := time.Now()
	inserted, dups := feed(t, pool, msgs)
	waitAllDone(t, pool, 90*time.Second)
	t.Logf("10000 events (%d deliveries) received and processed by 8 workers in %s", total, time.Since(start))
	require.Equal(t, 10000, inserted)
	require.Equal(t, total-10000, dups)
	require.Equal(t, 10000, queryInt(t, pool, `SELECT count(*) FROM ledger_entries`))
	require.Equal(t, 10000, queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox WHERE status = 'processed'`))
	require.Equal(t, 10000, stats.Snapshot().Processed)
}

// TestTwoWorkerProcesses: two worker processes over 10,000 events each
// delivered 1 to 3 times: exactly 10,000 ledger entries, every row processed,
// both processes did part of the work, and both stop gracefully on SIGTERM.
func TestTwoWorkerProcesses(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	createOrders(t, pool, orderIDs()...)
	c1 := startChild(t, "worker", url)
	c2 := startChild(t, "worker", url)

	msgs, _ := deliveries(10000)
	start := time.Now()
	inserted, _ := feed(t, pool, msgs)
	require.Equal(t, 10000, inserted)
	waitAllDone(t, pool, 120*time.Second)
	t.Logf("10000 events processed by two worker processes in %s", time.Since(start))
	require.Equal(t, 10000, queryInt(t, pool, `SELECT count(*) FROM ledger_entries`))
	require.Equal(t, 10000, queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox WHERE status = 'processed'`))

	handled := map[string]int{}
	for _, c := range []*child{c1, c2} {
		require.NoError(t, c.cmd.Process.Signal(syscall.SIGTERM))
		require.False(t, c.wait(t, 30*time.Second), "graceful stop")
		n := 0
		for l := range c.lines {
			if id, ok := strings.CutPrefix(l, "handled "); ok {
				handled[id]++
				n++
			}
		}
		require.Positive(t, n, "each process did part of the work")
	}
	require.Len(t, handled, 10000, "every event was handled by one of the processes")
}
