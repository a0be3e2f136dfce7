package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	pgnats "github.com/pgrelay/pgrelay/broker/nats"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/ledger"
	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/internal/testnats"
)

// tmuxSession is a tmux server of its own (its own socket, in the test's
// temporary directory) running one session, so the test never touches the
// user's tmux.
type tmuxSession struct {
	t      *testing.T
	bin    string
	socket string
}

func (s *tmuxSession) run(args ...string) string {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, s.bin, append([]string{"-S", s.socket}, args...)...).CombinedOutput()
	require.NoError(s.t, err, "tmux %v: %s", args, out)
	return string(out)
}

func (s *tmuxSession) capture() string { return s.run("capture-pane", "-p", "-t", "console") }

func (s *tmuxSession) keys(keys ...string) {
	s.run(append([]string{"send-keys", "-t", "console"}, keys...)...)
}

// waitFor waits until the screen shows every one of want, and returns it.
func (s *tmuxSession) waitFor(what string, want ...string) string {
	s.t.Helper()
	var screen string
	deadline := time.Now().Add(20 * time.Second)
	for {
		screen = s.capture()
		missing := ""
		for _, w := range want {
			if !strings.Contains(screen, w) {
				missing = w
				break
			}
		}
		if missing == "" {
			return screen
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("%s: the screen never showed %q:\n%s", what, missing, screen)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// saveCapture writes a screen to $PGRELAY_CONSOLE_CAPTURES/name.txt when
// that is set (docs/console.md shows them).
func saveCapture(t *testing.T, name, screen string) {
	if dir := os.Getenv("PGRELAY_CONSOLE_CAPTURES"); dir != "" {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name+".txt"), []byte(screen), 0o644))
	}
}

// TestConsoleInTmux drives `consumer tui` in a real terminal (tmux) against
// a live relay and consumer with duplicates injected, and checks what the
// screen shows at 80x24 and at 200x60, and that purging a dead key asks
// first and writes the audit row. It skips without tmux, except under CI.
func TestConsoleInTmux(t *testing.T) {
	t.Parallel()
	tmux, err := exec.LookPath("tmux")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("tmux is required for the console test under CI (apt-get install tmux; .ci/run installs it)")
		}
		t.Skip("tmux not installed: the console test needs it")
	}
	dir := bins(t)
	dbURL := testdb.NewURL(t)
	pool := newPool(t, dbURL)
	natsURL := testnats.URL(t)
	stream, prefix := testnats.Stream(t, natsURL)
	_, js := testnats.Connect(t, natsURL)

	startService(t, filepath.Join(dir, "relay"), []string{
		"DATABASE_URL=" + dbURL, "NATS_URL=" + natsURL, "RELAY_STREAM=" + stream, "RELAY_SUBJECT_PREFIX=" + prefix,
		"METRICS_ADDR=", "ADMIN_ADDR=", "LOG_LEVEL=warn",
	}, "run")
	metricsAddr := freeAddr(t)
	consumerBin := filepath.Join(dir, "consumer")
	startService(t, consumerBin, consumerEnv(dbURL, natsURL, stream, prefix, "METRICS_ADDR="+metricsAddr, "LOG_LEVEL=warn", "CONSUMER_HANDLER_NAME=ledger"), "run")

	// Three orders through the relay, credited by the consumer.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ob, err := pgrelay.NewOutbox(pgrelay.OutboxConfig{})
	require.NoError(t, err)
	var msgs []pgrelay.Message
	for i := range 3 {
		id := fmt.Sprintf("order-%d", i)
		b, err := json.Marshal(ledger.OrderCreated{OrderID: id, CustomerID: "c", AmountCents: 100, Currency: "EUR"})
		require.NoError(t, err)
		msgs = append(msgs, pgrelay.Message{EventID: "created-" + id, Topic: "orders", Key: id, EventType: ledger.EventOrderCreated, Payload: b})
	}
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return ob.Enqueue(ctx, tx, msgs...) }))
	require.Eventually(t, func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox WHERE status = 'processed'`) == 3
	}, time.Minute, 50*time.Millisecond)

	// Duplicates: the same events published again under new broker message
	// ids (so JetStream's own dedup lets them through), twice for one of them.
	// And one malformed message, stored dead at ingest.
	publish := func(msgID, eventID, typ string, data []byte) {
		m := nats.NewMsg(prefix + ".orders")
		m.Header.Set(pgnats.MsgIDHeader, msgID)
		m.Header.Set(event.HeaderEventID, eventID)
		if typ != "" {
			m.Header.Set(event.HeaderEventType, typ)
		}
		m.Header.Set(event.HeaderTopic, "orders")
		m.Data = data
		_, err := js.PublishMsg(ctx, m)
		require.NoError(t, err)
	}
	for i, id := range []string{"created-order-0", "created-order-1", "created-order-0"} {
		publish(fmt.Sprintf("redelivery-%d", i), id, ledger.EventOrderCreated, msgs[0].Payload)
	}
	publish("dead-evt-1", "dead-evt-1", "", []byte(`{}`))
	require.Eventually(t, func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox_duplicates`) == 3 &&
			queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox WHERE event_id = 'dead-evt-1' AND status = 'dead'`) == 1
	}, time.Minute, 50*time.Millisecond)
	require.Equal(t, int64(3), queryInt(t, pool, `SELECT count(*) FROM ledger_orders`), "the duplicates created no order")

	s := &tmuxSession{t: t, bin: tmux, socket: filepath.Join(t.TempDir(), "tmux.sock")}
	command := strings.Join([]string{consumerBin, "tui", "--database-url", "'" + dbURL + "'", "--nats-url", natsURL,
		"--stream", stream, "--metrics-url", "http://" + metricsAddr + "/metrics", "--refresh", "500ms",
		"--actor", "it-operator", "--dedup-window", "12h", "--export-dir", t.TempDir()}, " ")
	s.run("new-session", "-d", "-s", "console", "-x", "80", "-y", "24", command)
	t.Cleanup(func() {
		_ = exec.Command(tmux, "-S", s.socket, "kill-server").Run()
	})

	// 80x24: tabs.
	screen := s.waitFor("stats tab", "[1 Stats]", "3 duplicates blocked of 7 received", "created-order-0", "ledger", "process: 3 of 7")
	require.Contains(t, screen, "Hit rate 24h")
	require.Contains(t, screen, " old", "the original's age")
	require.Contains(t, screen, "window 12h00m")
	saveCapture(t, "80x24-stats", screen)

	s.keys("2")
	screen = s.waitFor("keys tab", "[2 Keys]", "dead-evt-1", "kept (dead)", "created-order-2", "processed")
	saveCapture(t, "80x24-keys", screen)
	s.keys("3")
	screen = s.waitFor("outbox tab", "[3 Outbox]", "relays alive 1 of 1", "partitions held 16 of 16")
	saveCapture(t, "80x24-outbox", screen)
	s.keys("4")
	screen = s.waitFor("config tab", "[4 Config]", "Advice", "dedup window 12h00m shorter than the", "stream MaxAge")
	saveCapture(t, "80x24-config", screen)

	// A destructive key asks first; its audit row is written like the CLI's.
	s.keys("2")
	s.waitFor("keys tab", "[2 Keys]")
	// Keys sent at once reach the console as one input, so each waits for
	// the screen to answer the previous one.
	s.keys("/")
	s.waitFor("search prompt", "/part of an event id")
	s.keys("-l", "dead-evt")
	s.waitFor("search typed", "/dead-evt")
	s.keys("Enter")
	s.waitFor("search", "1 keys · search /dead-evt", "> dead-evt-1")
	s.keys("d")
	screen = s.waitFor("confirmation", "Purge dead event dead-evt-1?", "it-operator", "[y] yes")
	saveCapture(t, "80x24-confirm", screen)
	require.Zero(t, queryInt(t, pool, `SELECT count(*) FROM pgrelay.replay_audit`), "nothing before the answer")
	s.keys("y")
	s.waitFor("purge", "purged dead-evt-1 (audit #")
	require.Equal(t, int64(1), queryInt(t, pool, `SELECT count(*) FROM pgrelay.replay_audit
		WHERE action = 'purge' AND source = 'inbox' AND event_id = 'dead-evt-1' AND actor = 'it-operator'`))
	require.Zero(t, queryInt(t, pool, `SELECT count(*) FROM pgrelay.inbox WHERE event_id = 'dead-evt-1'`))
	s.keys("Escape")
	s.waitFor("search cleared", "3 keys · all recent keys")
	s.keys("1")
	s.waitFor("stats tab", "[1 Stats]")

	// 200x60: the three panels and the outbox at once.
	s.run("resize-window", "-t", "console", "-x", "200", "-y", "60")
	screen = s.waitFor("wide layout", "┌ Dedup", "┌ Keys", "┌ Config & tuning", "┌ Outbox", "created-order-0",
		"relays alive 1 of 1", "Advice", "refreshed")
	var row string
	for _, l := range strings.Split(screen, "\n") {
		if strings.Contains(l, "┌ Dedup") {
			row = l
		}
	}
	require.Contains(t, row, "┌ Keys", "side by side")
	require.Contains(t, row, "┌ Config & tuning", "side by side")
	saveCapture(t, "200x60", screen)

	s.keys("h")
	screen = s.waitFor("help", "Ctrl+R", "run inbox retention now")
	saveCapture(t, "200x60-help", screen)
	// Close the help, then quit.
	s.keys("x")
	s.waitFor("help closed", "┌ Dedup")
	s.keys("q")
	require.Eventually(t, func() bool {
		return exec.Command(tmux, "-S", s.socket, "has-session", "-t", "console").Run() != nil
	}, 10*time.Second, 100*time.Millisecond, "q quits the console")
}
