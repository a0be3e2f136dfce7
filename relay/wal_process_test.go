package relay

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker/nats"
)

// walChildEnv makes the test binary a WAL-capture relay process (runWALChild)
// that a test can SIGKILL and SIGSTOP.
const walChildEnv = "PGRELAY_TEST_WAL_CHILD"

// runWALChild runs a WAL-capture relay named CHILD_NAME until killed; its
// replication connection carries the name as application_name, so that a
// test can tell which process streams the slot.
func runWALChild() int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("CHILD_DATABASE_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	pub, err := nats.NewPublisher(ctx, nats.Config{
		URL: os.Getenv("CHILD_NATS_URL"), SubjectPrefix: os.Getenv("CHILD_PREFIX"), Stream: os.Getenv("CHILD_STREAM"),
		AckTimeout: 2 * time.Second, ReconnectWait: 50 * time.Millisecond,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	conn := pool.Config().ConnConfig.Config.Copy()
	conn.RuntimeParams["application_name"] = os.Getenv("CHILD_NAME")
	r, err := newEngine(Config{
		Pool: pool, Publisher: pub, NodeID: os.Getenv("CHILD_NAME"), Capture: CaptureWAL,
		HeartbeatInterval: 300 * time.Millisecond, Lease: time.Second, BackoffMin: 20 * time.Millisecond, BackoffMax: 500 * time.Millisecond,
		walConnConfig: conn, walStandbyPoll: 100 * time.Millisecond,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if err := r.run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// walChild is a relay process of TestWALProcessFaults.
type walChild struct {
	name string
	cmd  *exec.Cmd
}

func (b *bundle) startWALChild(t *testing.T, name string) *walChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), walChildEnv+"=1", "CHILD_DATABASE_URL="+b.dbURL, "CHILD_NATS_URL="+b.natsURL,
		"CHILD_PREFIX="+b.prefix, "CHILD_STREAM="+b.stream, "CHILD_NAME="+name)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	require.NoError(t, cmd.Start())
	c := &walChild{name: name, cmd: cmd}
	t.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGCONT); _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return c
}

// reader returns the application_name of the process streaming the slot
// ("" when none).
func (b *bundle) reader(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var name string
	err := b.pool.QueryRow(ctx, `SELECT coalesce((SELECT application_name FROM pg_stat_replication r
		WHERE r.pid = s.active_pid), '') FROM pg_replication_slots s WHERE slot_name = $1`, DefaultWALSlot).Scan(&name)
	if err != nil {
		return ""
	}
	return name
}

func (b *bundle) waitReader(t *testing.T, not string, within time.Duration) string {
	t.Helper()
	var name string
	require.Eventually(t, func() bool { name = b.reader(t); return name != "" && name != not }, within, 50*time.Millisecond,
		"no relay other than %q streams the slot", not)
	return name
}

// TestWALProcessFaults: two relay processes on one slot while a producer
// emits; the streaming one is SIGKILLed, then SIGSTOPped past
// wal_sender_timeout, PostgreSQL restarts (immediate), and the reader's
// connection is cut (pg_terminate_backend of its wal sender). Every
// committed event is in the stream exactly once, each key's in commit order.
func TestWALProcessFaults(t *testing.T) {
	b, c := walSetup(t, walConf)
	children := map[string]*walChild{}
	children["a"] = b.startWALChild(t, "a")
	first := b.waitReader(t, "", 30*time.Second)
	children["b"] = b.startWALChild(t, "b")

	// The producer: one event per transaction, ten keys, each key's events
	// numbered in commit order; retried through the PostgreSQL restart.
	ctx, stopProducer := context.WithCancel(context.Background())
	var mu sync.Mutex
	committed := map[string]string{} // event id -> key
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		o, _ := pgrelay.NewOutbox(pgrelay.OutboxConfig{})
		next := map[string]int{}
		for i := 0; ctx.Err() == nil; i++ {
			key := fmt.Sprintf("k%d", i%10)
			id := fmt.Sprintf("%s-%d", key, next[key]+1)
			m := pgrelay.Message{EventID: id, Topic: "orders", Key: key, Payload: []byte(strconv.Itoa(next[key] + 1))}
			tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := pgx.BeginFunc(tctx, b.pool, func(tx pgx.Tx) error { return o.Emit(tctx, tx, m) })
			cancel()
			if err != nil {
				// A commit whose outcome is unknown (the server went away
				// during COMMIT) is retried under the same id: published
				// at most once either way.
				time.Sleep(50 * time.Millisecond)
				i--
				continue
			}
			next[key]++
			mu.Lock()
			committed[id] = key
			mu.Unlock()
			time.Sleep(10 * time.Millisecond)
		}
	}()
	time.Sleep(time.Second)

	// 1. SIGKILL the reader: the standby takes over.
	require.NoError(t, children[first].cmd.Process.Kill())
	_ = children[first].cmd.Wait()
	second := b.waitReader(t, first, 20*time.Second)
	t.Logf("SIGKILL %s: %s took over", first, second)
	children[first] = b.startWALChild(t, first)
	time.Sleep(time.Second)

	// 2. SIGSTOP the reader past wal_sender_timeout (2s), then SIGCONT.
	require.NoError(t, children[second].cmd.Process.Signal(syscall.SIGSTOP))
	third := b.waitReader(t, second, 20*time.Second)
	t.Logf("SIGSTOP %s: %s took over", second, third)
	time.Sleep(time.Second)
	require.NoError(t, children[second].cmd.Process.Signal(syscall.SIGCONT))
	time.Sleep(time.Second)

	// 3. PostgreSQL restarts at once (a crash).
	rctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	require.NoError(t, c.Restart(rctx, "immediate"))
	cancel()
	after := b.waitReader(t, "", 30*time.Second)
	t.Logf("PostgreSQL restarted: %s streams", after)
	time.Sleep(time.Second)

	// 4. The reader's connection is cut.
	activePID := func() int {
		var pid *int
		_ = b.pool.QueryRow(context.Background(), `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`, DefaultWALSlot).Scan(&pid)
		if pid == nil {
			return 0
		}
		return *pid
	}
	cut := activePID()
	_, err := b.pool.Exec(context.Background(), `SELECT pg_terminate_backend($1)`, cut)
	require.NoError(t, err)
	require.Eventually(t, func() bool { p := activePID(); return p != 0 && p != cut }, 20*time.Second, 50*time.Millisecond)
	t.Logf("connection of %s cut: %s streams", after, b.waitReader(t, "", 20*time.Second))
	time.Sleep(time.Second)
	stopProducer()
	wg.Wait()

	// Every committed event once, each key's in commit order.
	mu.Lock()
	want := len(committed)
	mu.Unlock()
	require.Greater(t, want, 100)
	ch := b.subscribe(t)
	seen := map[string]int{}
	lastOf := map[string]int{}
	deadline := time.After(60 * time.Second)
	for len(seen) < want {
		select {
		case m := <-ch:
			seen[m.eventID]++
			n, _ := strconv.Atoi(string(m.data))
			if n <= lastOf[m.key] {
				t.Fatalf("key %s: event %d after %d", m.key, n, lastOf[m.key])
			}
			lastOf[m.key] = n
		case <-deadline:
			var missing []string
			mu.Lock()
			for id := range committed {
				if seen[id] == 0 {
					missing = append(missing, id)
				}
			}
			mu.Unlock()
			t.Fatalf("%d of %d events in the stream; missing %v", len(seen), want, missing)
		}
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("event %s in the stream %d times", id, n)
		}
		mu.Lock()
		_, ok := committed[id]
		mu.Unlock()
		if !ok {
			t.Errorf("event %s in the stream was never reported committed", id)
		}
	}
	select {
	case m := <-ch:
		// An event whose commit the producer could not confirm (the server
		// went away during COMMIT) and that committed all the same.
		t.Logf("extra event %s (a commit whose outcome the producer did not see)", m.eventID)
	case <-time.After(500 * time.Millisecond):
	}
	t.Logf("%d events, each once, in per-key commit order", want)
}
