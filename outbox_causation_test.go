package pgrelay_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/nats"
	"github.com/pgrelay/pgrelay/consumer"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/internal/testnats"
	"github.com/pgrelay/pgrelay/relay"
)

// The test binary re-executes itself as a consumer process (hopChildEnv=1)
// so that a test can kill a real consumer inside its handler's transaction.
const hopChildEnv = "PGRELAY_TEST_HOP_CHILD"

// runHopChild runs a consumer whose handler turns each event of type A into
// an event of type B (enqueued in the handler's transaction with its ctx) and
// records each event's effect in hop_effects. With CHILD_CRASH_MARKER set and
// that file absent, the first A handled creates the file and SIGKILLs the
// process after the handler's writes, before the transaction commits.
func runHopChild() int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("CHILD_DATABASE_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ob, err := pgrelay.NewOutbox(pgrelay.OutboxConfig{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	marker := os.Getenv("CHILD_CRASH_MARKER")
	handler := pgrelay.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgrelay.InboxEvent) error {
		if _, err := tx.Exec(ctx, `INSERT INTO hop_effects (event_id, kind, causation, correlation) VALUES ($1, $2, $3, $4)`,
			ev.EventID, ev.EventType, ev.CausationID(), ev.CorrelationID()); err != nil {
			return err
		}
		if ev.EventType != "A" {
			return nil
		}
		if err := ob.Enqueue(ctx, tx, pgrelay.Message{Topic: "receipts", Key: ev.Key, EventType: "B", Payload: ev.Payload}); err != nil {
			return err
		}
		if marker != "" {
			if _, err := os.Stat(marker); errors.Is(err, os.ErrNotExist) {
				if err := os.WriteFile(marker, nil, 0o600); err != nil {
					return err
				}
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {}
			}
		}
		return nil
	})
	c, err := consumer.New(consumer.Config{
		Pool: pool,
		Subscribe: broker.Subscribe(nats.NewSubscriber, nats.Config{URL: os.Getenv("CHILD_NATS_URL"), Stream: os.Getenv("CHILD_STREAM"),
			SubjectPrefix: os.Getenv("CHILD_PREFIX"), Durable: "hops"}),
		Inbox: pgrelay.InboxConfig{Handler: handler, Workers: 1, Lease: 2 * time.Second, HandlerTimeout: time.Second},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if err := c.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// TestConsumeProduceOneTransaction: two hops, A → a handler enqueueing B in
// its own transaction → relay → the consumer handling B, with the first
// consumer process SIGKILLed inside A's handler, after the enqueue and before
// the commit. The killed attempt leaves nothing (no B in the outbox, no
// effect); the retry in a new process enqueues B once per A. Each B carries
// Pgrelay-Causation-Id = A's event id and Pgrelay-Correlation-Id = A's
// correlation id (A's own event id when A had none) through the outbox, the
// broker and the inbox, and each effect is applied once.
func TestConsumeProduceOneTransaction(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dbURL := testdb.NewURL(t)
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	natsURL := testnats.URL(t)
	stream, prefix := testnats.Stream(t, natsURL)
	_, err = pool.Exec(ctx, `CREATE TABLE hop_effects (event_id text NOT NULL, kind text NOT NULL, causation text NOT NULL, correlation text NOT NULL)`)
	require.NoError(t, err)

	// Two inputs: one in a chain of its own, one starting a chain.
	a1 := pgrelay.Message{EventID: "a-1", Topic: "orders", Key: "o-1", EventType: "A", Payload: []byte(`{"n":1}`),
		Headers: map[string]string{event.HeaderCorrelationID: "checkout-7"}}
	a2 := pgrelay.Message{EventID: "a-2", Topic: "orders", Key: "o-2", EventType: "A", Payload: []byte(`{"n":2}`)}
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	ob, err := pgrelay.NewOutbox(pgrelay.OutboxConfig{})
	require.NoError(t, err)
	require.NoError(t, ob.Enqueue(ctx, tx, a1, a2))
	require.NoError(t, tx.Commit(ctx))

	pub, err := nats.NewPublisher(ctx, nats.Config{URL: natsURL, SubjectPrefix: prefix, Stream: stream})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	r, err := relay.New(relay.Config{Pool: pool, Publisher: pub, NodeID: "hops"})
	require.NoError(t, err)
	rctx, stopRelay := context.WithCancel(context.Background())
	relayDone := make(chan error, 1)
	go func() { relayDone <- r.Run(rctx) }()
	t.Cleanup(func() { stopRelay(); <-relayDone })

	marker := filepath.Join(t.TempDir(), "crashed")
	start := func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), hopChildEnv+"=1", "CHILD_DATABASE_URL="+dbURL, "CHILD_NATS_URL="+natsURL,
			"CHILD_PREFIX="+prefix, "CHILD_STREAM="+stream, "CHILD_CRASH_MARKER="+marker)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		require.NoError(t, cmd.Start())
		return cmd
	}

	// The first consumer dies inside A's handler.
	first := start()
	exited := make(chan error, 1)
	go func() { exited <- first.Wait() }()
	select {
	case <-exited:
	case <-ctx.Done():
		_ = first.Process.Kill()
		t.Fatal("the first consumer did not reach A's handler")
	}
	ws, ok := first.ProcessState.Sys().(syscall.WaitStatus)
	require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL, "the first consumer must die by SIGKILL: %v", first.ProcessState)
	count := func(sql string, args ...any) int {
		t.Helper()
		var n int
		require.NoError(t, pool.QueryRow(ctx, sql, args...).Scan(&n))
		return n
	}
	require.Zero(t, count(`SELECT count(*) FROM pgrelay.outbox WHERE topic = 'receipts'`), "the killed attempt enqueued nothing")
	require.Zero(t, count(`SELECT count(*) FROM hop_effects WHERE kind = 'A'`), "the killed attempt applied nothing")

	// A new consumer retries A after its lease and handles B.
	second := start()
	t.Cleanup(func() { _ = second.Process.Kill(); _ = second.Wait() })
	for count(`SELECT count(*) FROM pgrelay.inbox WHERE event_type = 'B' AND status = 'processed'`) < 2 {
		select {
		case <-ctx.Done():
			t.Fatalf("B not processed: %v", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}

	wantCorrelation := map[string]string{"a-1": "checkout-7", "a-2": "a-2"}
	rows, err := pool.Query(ctx, `SELECT event_id, headers->>'Pgrelay-Causation-Id', headers->>'Pgrelay-Correlation-Id' FROM pgrelay.outbox WHERE topic = 'receipts'`)
	require.NoError(t, err)
	type b struct{ id, causation, correlation string }
	bs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (b, error) {
		var v b
		var c, r *string
		err := row.Scan(&v.id, &c, &r)
		if c != nil {
			v.causation = *c
		}
		if r != nil {
			v.correlation = *r
		}
		return v, err
	})
	require.NoError(t, err)
	require.Len(t, bs, 2, "one B per A, however often A's handler ran")
	seen := map[string]bool{}
	for _, v := range bs {
		require.Contains(t, wantCorrelation, v.causation, "B %s: causation", v.id)
		require.False(t, seen[v.causation], "two Bs caused by %s", v.causation)
		seen[v.causation] = true
		require.Equal(t, wantCorrelation[v.causation], v.correlation, "B %s: correlation", v.id)

		// Through the broker into the inbox, and to the handler.
		var inboxCausation, inboxCorrelation string
		require.NoError(t, pool.QueryRow(ctx, `SELECT headers->>'Pgrelay-Causation-Id', headers->>'Pgrelay-Correlation-Id' FROM pgrelay.inbox WHERE event_id = $1`, v.id).
			Scan(&inboxCausation, &inboxCorrelation))
		require.Equal(t, v.causation, inboxCausation, "B %s in the inbox: causation", v.id)
		require.Equal(t, v.correlation, inboxCorrelation, "B %s in the inbox: correlation", v.id)
		require.Equal(t, 1, count(`SELECT count(*) FROM hop_effects WHERE event_id = $1 AND kind = 'B' AND causation = $2 AND correlation = $3`,
			v.id, v.causation, v.correlation), "B %s: its effect, applied once, saw its cause", v.id)
	}
	// On the broker, under pgrelay's own header names.
	_, js := testnats.Connect(t, natsURL)
	st, err := js.Stream(ctx, stream)
	require.NoError(t, err)
	msg, err := st.GetLastMsgForSubject(ctx, prefix+".receipts")
	require.NoError(t, err)
	require.Contains(t, wantCorrelation, msg.Header.Get(event.HeaderCausationID), "the broker message's %s header", event.HeaderCausationID)
	require.Equal(t, wantCorrelation[msg.Header.Get(event.HeaderCausationID)], msg.Header.Get(event.HeaderCorrelationID))

	for _, a := range []string{"a-1", "a-2"} {
		require.Equal(t, 1, count(`SELECT count(*) FROM hop_effects WHERE event_id = $1`, a), "A %s: effect applied once", a)
	}
	require.Equal(t, 2, count(`SELECT count(*) FROM hop_effects WHERE kind = 'B'`))
	// The killed run was either a claimed attempt (counted: attempts 2) or a
	// run on receive (not stored, so not counted; the redelivery is never
	// applied on receive, and its claim counts attempt 1). Either way A was
	// handled again, by a counted attempt, and applied once (above).
	require.Equal(t, 2, count(`SELECT count(*) FROM pgrelay.inbox WHERE event_type = 'A' AND status = 'processed' AND attempts >= 1`),
		"each A handled again after the crash, by a counted attempt")
}
