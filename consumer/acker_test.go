package consumer

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/internal/logtest"
)

// fakeWAL is a walSession whose flushed position the test sets.
type fakeWAL struct {
	opened time.Time
	srv    string
	mu     sync.Mutex
	flush  uint64
	insert uint64 // where a forced flush flushes to
	forced int
	fail   error
}

func (f *fakeWAL) since() time.Time { return f.opened }
func (f *fakeWAL) server() string   { return f.srv }
func (f *fakeWAL) flushed(context.Context) (uint64, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.flush, false, f.fail
}
func (f *fakeWAL) forceFlush(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return f.fail
	}
	f.forced++
	f.flush = max(f.flush, f.insert)
	return nil
}
func (f *fakeWAL) close() {}
func (f *fakeWAL) set(flush uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.flush = flush
}
func (f *fakeWAL) forcedCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.forced
}

// ackLog records the acknowledged deliveries' refs in order.
type ackLog struct {
	mu   sync.Mutex
	refs []string
}

func (l *ackLog) ack(ds []broker.Delivery) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, d := range ds {
		l.refs = append(l.refs, d.Ref)
	}
}

func (l *ackLog) got() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.refs...)
}

func testAcker(t *testing.T, w *fakeWAL, flushAfter time.Duration, maxPending int) (*acker, *ackLog) {
	log := &ackLog{}
	a := &acker{
		in: make(chan ackEntry), done: make(chan struct{}),
		dial: func(context.Context) (walSession, error) { return w, nil },
		ack:  log.ack, log: logtest.New(t),
		poll: time.Millisecond, flushAfter: flushAfter, maxPending: maxPending,
		timeout: time.Second, retry: 10 * time.Millisecond, open: &atomic.Bool{},
	}
	go a.run()
	require.Eventually(t, a.open.Load, 5*time.Second, time.Millisecond)
	return a, log
}

func batch(refs ...string) []broker.Delivery {
	ds := make([]broker.Delivery, len(refs))
	for i, r := range refs {
		ds[i].Ref = r
	}
	return ds
}

func mark(lsn uint64) commitMark {
	return commitMark{n: 1, lsn: lsn, sent: time.Now(), server: "s"}
}

// TestAckerAcknowledgesInOrderOnceFlushed: nothing is acknowledged before
// the flushed position reaches a batch's commit; then the batches are
// acknowledged in the order they were handed over.
func TestAckerAcknowledgesInOrderOnceFlushed(t *testing.T) {
	t.Parallel()
	w := &fakeWAL{opened: time.Now(), srv: "s", flush: 100}
	a, log := testAcker(t, w, time.Hour, 8)
	time.Sleep(time.Millisecond)
	a.add(mark(200), batch("a1", "a2"))
	a.add(mark(300), batch("b1"))
	a.add(mark(400), batch("c1"))
	time.Sleep(20 * time.Millisecond)
	require.Empty(t, log.got(), "acknowledged before the flush")
	w.set(300)
	require.Eventually(t, func() bool { return len(log.got()) == 3 }, 5*time.Second, time.Millisecond)
	require.Equal(t, []string{"a1", "a2", "b1"}, log.got())
	time.Sleep(20 * time.Millisecond)
	require.Len(t, log.got(), 3, "c1's commit is not flushed")
	w.set(400)
	require.Eventually(t, func() bool { return len(log.got()) == 4 }, 5*time.Second, time.Millisecond)
	require.Equal(t, "c1", log.got()[3])
	require.Zero(t, w.forcedCount())
	a.stop()
}

// TestAckerForcesAFlushAfterTheBound: a batch whose commit the server does
// not flush is acknowledged after the acker forces the flush, once it has
// waited flushAfter, not before.
func TestAckerForcesAFlushAfterTheBound(t *testing.T) {
	t.Parallel()
	w := &fakeWAL{opened: time.Now(), srv: "s", flush: 100, insert: 500}
	a, log := testAcker(t, w, 50*time.Millisecond, 8)
	time.Sleep(time.Millisecond)
	start := time.Now()
	a.add(mark(200), batch("a1"))
	require.Eventually(t, func() bool { return len(log.got()) == 1 }, 5*time.Second, time.Millisecond)
	require.GreaterOrEqual(t, time.Since(start), 50*time.Millisecond, "forced before the bound")
	require.Equal(t, 1, w.forcedCount())
	a.stop()
}

// TestAckerStopDrainsPending: on stop the acker forces a flush and
// acknowledges every batch handed over before it returns.
func TestAckerStopDrainsPending(t *testing.T) {
	t.Parallel()
	w := &fakeWAL{opened: time.Now(), srv: "s", flush: 100, insert: 500}
	a, log := testAcker(t, w, time.Hour, 8)
	time.Sleep(time.Millisecond)
	a.add(mark(200), batch("a1"))
	a.add(mark(300), batch("b1", "b2"))
	a.stop()
	require.Equal(t, []string{"a1", "b1", "b2"}, log.got())
	require.Equal(t, 1, w.forcedCount())
}

// TestAckerDropsWhatItCannotProve: a database failure drops the waiting
// batches unacknowledged; so does a commit sent before the session opened
// or to another server.
func TestAckerDropsWhatItCannotProve(t *testing.T) {
	t.Parallel()
	w := &fakeWAL{opened: time.Now(), srv: "s", flush: 100, insert: 500}
	early := mark(200)
	early.sent = w.opened.Add(-time.Millisecond) // before the session opened
	a, log := testAcker(t, w, time.Hour, 8)
	time.Sleep(time.Millisecond)
	a.add(early, batch("early"))
	other := mark(200)
	other.server = "t"
	a.add(other, batch("other"))
	a.add(mark(200), batch("a1"))
	w.set(300)
	require.Eventually(t, func() bool { return len(log.got()) == 1 }, 5*time.Second, time.Millisecond)
	require.Equal(t, []string{"a1"}, log.got())

	w.mu.Lock()
	w.fail = errors.New("connection lost")
	w.mu.Unlock()
	a.add(mark(400), batch("b1"))
	a.stop() // the forced flush fails: b1 is dropped
	require.Equal(t, []string{"a1"}, log.got())
}

// TestAckerBoundsPending: with maxPending batches waiting, handing over one
// more waits (the ingest loop is held) until one is acknowledged.
func TestAckerBoundsPending(t *testing.T) {
	t.Parallel()
	w := &fakeWAL{opened: time.Now(), srv: "s", flush: 100}
	a, log := testAcker(t, w, time.Hour, 2)
	time.Sleep(time.Millisecond)
	a.add(mark(200), batch("a"))
	a.add(mark(300), batch("b"))
	handed := make(chan struct{})
	go func() {
		a.add(mark(400), batch("c"))
		close(handed)
	}()
	select {
	case <-handed:
		t.Fatal("a third batch was taken while two waited")
	case <-time.After(50 * time.Millisecond):
	}
	w.set(200)
	select {
	case <-handed:
	case <-time.After(5 * time.Second):
		t.Fatal("the third batch was not taken after the first was acknowledged")
	}
	w.set(400)
	require.Eventually(t, func() bool { return len(log.got()) == 3 }, 5*time.Second, time.Millisecond)
	require.Equal(t, []string{"a", "b", "c"}, log.got())
	a.stop()
}

func TestParseLSN(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]uint64{"0/0": 0, "0/16B3748": 0x16B3748, "1/0": 1 << 32, "FFFFFFFF/FFFFFFFF": 1<<64 - 1} {
		got, err := parseLSN(s)
		require.NoError(t, err, s)
		require.Equal(t, want, got, s)
	}
	for _, s := range []string{"", "16B3748", "x/1", "1/100000000"} {
		_, err := parseLSN(s)
		require.Error(t, err, s)
	}
}

func TestAsyncCommitSettingsValidated(t *testing.T) {
	t.Parallel()
	pool := &pgxpool.Pool{}
	sub := func(context.Context) (broker.Subscriber, error) { return nil, nil }
	_, err := newConsumer(Config{Pool: pool, Subscribe: sub, disableWorkers: true, AsyncCommit: true})
	require.NoError(t, err)
	_, err = newConsumer(Config{Pool: pool, Subscribe: sub, disableWorkers: true, AsyncCommit: true, AsyncFlushAfter: -time.Millisecond})
	require.ErrorContains(t, err, "Config.AsyncFlushAfter -1ms must be positive")
	handler := pgrelay.HandlerFunc(func(context.Context, pgx.Tx, *pgrelay.InboxEvent) error { return nil })
	_, err = newConsumer(Config{Pool: pool, Direct: true, Register: func(context.Context) error { return nil }, AsyncCommit: true,
		Inbox: pgrelay.InboxConfig{Handler: handler}})
	require.ErrorContains(t, err, "Config.AsyncCommit is for the batches")
}
