package relay

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/nats"
	"github.com/pgrelay/pgrelay/internal/event"
)

// TestCommittedPublishedOnceRolledBackNever covers guarantee 1: a committed
// row is published exactly once, a rolled-back row never.
func TestCommittedPublishedOnceRolledBackNever(t *testing.T) {
	t.Parallel()
	b := setup(t)
	obs := &countingObserver{}
	start(t, b.testConfig(t, b.publisher(t), obs))
	sub := b.subscribe(t)

	committed := msgs(10, "order-1", "c")
	committed[0].Headers = map[string]string{"trace-id": "t-1"}
	committed[0].OccurredAt = time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)
	b.enqueue(t, committed...)

	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	o := msgs(5, "order-2", "rolled-back")
	_, err = tx.Exec(ctx, `INSERT INTO pgrelay.outbox (event_id, topic, key) VALUES ($1, 'orders', 'order-2')`, o[0].EventID)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))

	b.waitCount(t, "published", 10, 10*time.Second)
	var got []received
	for len(got) < 10 {
		select {
		case r := <-sub:
			got = append(got, r)
		case <-time.After(10 * time.Second):
			t.Fatalf("only %d messages arrived", len(got))
		}
	}
	for i, r := range got {
		require.Equal(t, fmt.Sprintf("c-%d", i), r.eventID)
		require.Equal(t, b.prefix+".orders", r.subject)
		require.Equal(t, r.eventID, r.headers[nats.MsgIDHeader][0])
		require.Equal(t, "OrderCreated", r.headers[event.HeaderEventType][0])
		require.Equal(t, "orders", r.headers[event.HeaderTopic][0])
		require.Equal(t, "order-1", r.headers[event.HeaderKey][0])
		require.Equal(t, i+1, r.seq)
	}
	require.Equal(t, "t-1", got[0].headers[event.HeaderPrefix+"trace-id"][0])
	require.Equal(t, "2026-01-02T03:04:05.000006Z", got[0].headers[event.HeaderOccurredAt][0])

	// A later event proves the relay kept running; nothing else was published.
	b.enqueue(t, msgs(1, "order-3", "later")...)
	b.waitCount(t, "published", 11, 10*time.Second)
	require.Equal(t, uint64(11), b.streamMsgs(t))
	eventually(t, func() bool { return obs.published.Load() == 11 }, "11 published events observed")
	require.Zero(t, obs.duplicates.Load(), "each event was published once")
	require.Zero(t, b.count(t, "pending"))
}

// TestKilledBetweenPublishAndMark covers guarantee 2 across a real crash: a
// relay process is SIGKILLed after the broker acknowledged a batch and before
// it marked it; the relay that takes over republishes the batch and JetStream
// reports every message as a duplicate, so the stream holds each once.
func TestKilledBetweenPublishAndMark(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.enqueue(t, msgs(20, "order-1", "k")...)

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", "CHILD_DATABASE_URL="+b.dbURL, "CHILD_NATS_URL="+b.natsURL,
		"CHILD_PREFIX="+b.prefix, "CHILD_STREAM="+b.stream)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "PUBLISHED\n", line)
	require.NoError(t, cmd.Process.Kill()) // SIGKILL: no shutdown, no release
	_ = cmd.Wait()

	require.Equal(t, uint64(20), b.streamMsgs(t), "the batch reached the broker")
	require.Equal(t, 20, b.count(t, "pending"), "nothing was marked")
	p := b.partitionOf(t, "order-1")
	owner, epoch := b.owner(t, p)
	require.Equal(t, "child", owner)

	obs := &countingObserver{}
	r, _ := start(t, b.testConfig(t, b.publisher(t), obs))
	b.waitCount(t, "published", 20, 15*time.Second)
	newOwner, newEpoch := b.owner(t, p)
	require.Equal(t, r.NodeID(), newOwner)
	require.Greater(t, newEpoch, epoch)
	require.Positive(t, obs.takenOver.Load(), "the dead relay's partitions were taken over")
	eventually(t, func() bool { return obs.duplicates.Load() == 20 }, "JetStream dropped every republished message as a duplicate")
	require.Equal(t, uint64(20), b.streamMsgs(t))
}

// TestZombieRelayIsFenced covers guarantee 4: relay A pauses (publisher and
// heartbeat both stuck) past its lease, B takes the partition over with a
// higher epoch, and when A resumes its mark changes nothing.
func TestZombieRelayIsFenced(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.enqueue(t, msgs(5, "order-1", "z")...)
	p := b.partitionOf(t, "order-1")

	var paused atomic.Bool
	resumeA := make(chan struct{})
	enteredA := make(chan struct{})
	releaseB := make(chan struct{})
	var once, resumeOnce, releaseOnce sync.Once
	resume := func() { resumeOnce.Do(func() { close(resumeA) }) }
	release := func() { releaseOnce.Do(func() { close(releaseB) }) }

	obsA := &countingObserver{}
	cfgA := b.testConfig(t, b.publisher(t), obsA)
	cfgA.NodeID = "relay-a"
	cfgA.hooks.afterPublish = func(part int32, _ []int64) {
		if part != p {
			return
		}
		once.Do(func() {
			paused.Store(true)
			close(enteredA)
			<-resumeA
		})
	}
	cfgA.hooks.beforeHeartbeat = func() {
		if paused.Load() {
			<-resumeA
		}
	}
	start(t, cfgA)
	<-enteredA
	_, epochA := b.owner(t, p)

	// B's publisher blocks until released, so the rows are still pending
	// when A resumes: only fencing can stop A from marking them.
	obsB := &countingObserver{}
	cfgB := b.testConfig(t, &gatedPublisher{Publisher: b.publisher(t), gate: releaseB}, obsB)
	cfgB.NodeID = "relay-b"
	cfgB.PublishTimeout = 5 * time.Minute // B waits at the gate, however slow the machine
	start(t, cfgB)
	// Cleanups run last-in first-out: these unblock both relays, when a
	// check failed, before they are stopped.
	t.Cleanup(release)
	t.Cleanup(resume)
	require.Eventually(t, func() bool { o, _ := b.owner(t, p); return o == "relay-b" }, 10*time.Second, 10*time.Millisecond)
	_, epochB := b.owner(t, p)
	require.Greater(t, epochB, epochA)

	paused.Store(false)
	resume()
	require.Eventually(t, func() bool { return obsA.fenced.Load() == 1 }, 10*time.Second, 10*time.Millisecond, "A's mark must be fenced")
	require.Equal(t, 5, b.count(t, "pending"), "the zombie marked nothing")
	require.Zero(t, obsA.published.Load())

	release()
	b.waitCount(t, "published", 5, 10*time.Second)
	require.Equal(t, uint64(5), b.streamMsgs(t))
	eventually(t, func() bool { return obsB.duplicates.Load() == 5 }, "B republished what A had published")
}

// gatedPublisher holds every Publish until gate is closed.
type gatedPublisher struct {
	broker.Publisher
	gate chan struct{}
}

func (g *gatedPublisher) Publish(ctx context.Context, msgs []pgrelay.Message) []broker.Result {
	select {
	case <-g.gate:
	case <-ctx.Done():
		out := make([]broker.Result, len(msgs))
		for i := range out {
			out[i].Err = ctx.Err()
		}
		return out
	}
	return g.Publisher.Publish(ctx, msgs)
}

// TestPerKeyCommitOrderWithThreeRelays covers guarantee 3: 3 relays (one
// joining late, one leaving midway), 50 keys, 20,000 events written by
// concurrent transactions that commit out of id order, and an unrelated
// transaction left open throughout. Every key's events arrive in commit
// order, none missing, some of them read by the relays' busy polls
// (PendingBatchMany) for their lingering workers.
func TestPerKeyCommitOrderWithThreeRelays(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("long")
	}
	const total, keys = 20000, 50
	b := setup(t)
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, `CREATE TABLE key_counters (key text PRIMARY KEY, n bigint NOT NULL)`)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `INSERT INTO key_counters SELECT 'key-' || k, 0 FROM generate_series(0, $1 - 1) AS k`, keys)
	require.NoError(t, err)

	// A long-running unrelated transaction holding an xid and a snapshot.
	idle, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer idle.Rollback(ctx) //nolint:errcheck
	_, err = idle.Exec(ctx, `SELECT pg_current_xact_id()`)
	require.NoError(t, err)

	obs := &countingObserver{}
	pub := b.publisher(t)
	// polled counts the rows pollBusy read for lingering workers.
	var polled atomic.Int64
	config := func() Config {
		cfg := b.testConfig(t, pub, obs)
		cfg.hooks.pollRead = func(_ []int32, rows int) { polled.Add(int64(rows)) }
		return cfg
	}
	_, stopA := start(t, config())
	start(t, config())
	sub := b.subscribe(t)

	// Writers: each transaction inserts 1-8 events of one key, sometimes
	// stalls, then numbers them from the key's counter (whose row lock is
	// held to commit, so the numbers follow commit order) and commits.
	var written atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(uint64(w), 7))
			for i := 0; ; i++ {
				n := 1 + rnd.IntN(8)
				if written.Add(int64(n)) > total {
					written.Add(-int64(n))
					if written.Load() >= total {
						return
					}
					n = 1
					if written.Add(1) > total {
						return
					}
				}
				key := fmt.Sprintf("key-%d", rnd.IntN(keys))
				err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
					// Durability is not under test; skip the commit flush.
					if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = off`); err != nil {
						return err
					}
					ms := make([]pgrelay.Message, n)
					for j := range ms {
						ms[j] = pgrelay.Message{EventID: fmt.Sprintf("w%d-%d-%d", w, i, j), Topic: "orders", Key: key}
					}
					if err := enqueueTx(ctx, tx, ms); err != nil {
						return err
					}
					if rnd.IntN(20) == 0 {
						time.Sleep(time.Duration(5+rnd.IntN(40)) * time.Millisecond) // commit late
					}
					ids := make([]string, n)
					for j, m := range ms {
						ids[j] = m.EventID
					}
					_, err := tx.Exec(ctx, `WITH c AS (UPDATE key_counters SET n = n + $2 WHERE key = $1 RETURNING n)
						UPDATE pgrelay.outbox o SET payload = convert_to((c.n - $2 + e.ord)::text, 'UTF8')
						FROM c, unnest($3::text[]) WITH ORDINALITY AS e(id, ord) WHERE o.event_id = e.id`, key, n, ids)
					return err
				})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}

	began := time.Now()
	go func() { wg.Wait(); t.Logf("writers done after %s", time.Since(began)) }()
	last := map[string]int{}
	seen := 0
	joined, left := false, false
	deadline := time.After(3 * time.Minute)
	for seen < total {
		select {
		case r := <-sub:
			require.Equal(t, last[r.key]+1, r.seq, "key %s: event %s out of commit order", r.key, r.eventID)
			last[r.key] = r.seq
			seen++
		case err := <-errs:
			t.Fatal(err)
		case <-deadline:
			t.Fatalf("only %d of %d events arrived", seen, total)
		}
		if seen == total/4 && !joined {
			joined = true
			start(t, config())
		}
		if seen == total/2 && !left {
			left = true
			go stopA()
		}
	}
	wg.Wait()
	t.Logf("all %d events read back in order after %s", total, time.Since(began))
	sum := 0
	for _, n := range last {
		sum += n
	}
	require.Equal(t, total, sum)
	b.waitCount(t, "published", total, 30*time.Second)
	require.Equal(t, uint64(total), b.streamMsgs(t))
	t.Logf("%d rows read by the busy poll", polled.Load())
	require.Positive(t, polled.Load(), "the busy poll read rows for lingering workers")
}

func enqueueTx(ctx context.Context, tx pgx.Tx, ms []pgrelay.Message) error {
	o, err := newOutboxForTest()
	if err != nil {
		return err
	}
	return o.Enqueue(ctx, tx, ms...)
}

// TestPermanentRejectionGoesDead: rows the broker can never take are marked
// dead with the reason, and the partition moves on in order.
func TestPermanentRejectionGoesDead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	obs := &countingObserver{}
	// Same key: ok-1, too large, bad headers, ok-2.
	b.enqueue(t, pgrelay.Message{EventID: "ok-1", Topic: "orders", Key: "k", Payload: []byte("1")})
	_, err := b.pool.Exec(ctx, `INSERT INTO pgrelay.outbox (event_id, topic, key, payload) VALUES ('big', 'orders', 'k', $1)`, make([]byte, 2<<20))
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `INSERT INTO pgrelay.outbox (event_id, topic, key, headers) VALUES ('bad-headers', 'orders', 'k', '{"n": 1}')`)
	require.NoError(t, err)
	// A topic no subject can carry never reaches the relay: the outbox
	// refuses it (outbox_topic_valid, the rule Enqueue applies).
	_, err = b.pool.Exec(ctx, `INSERT INTO pgrelay.outbox (event_id, topic, key) VALUES ('bad subject', 'orders x', 'k')`)
	require.ErrorContains(t, err, "outbox_topic_valid")
	b.enqueue(t, pgrelay.Message{EventID: "ok-2", Topic: "orders", Key: "k", Payload: []byte("2")})
	start(t, b.testConfig(t, b.publisher(t), obs))

	b.waitCount(t, "published", 2, 10*time.Second)
	require.Equal(t, 2, b.count(t, "dead"))
	reasons := map[string]string{}
	rows, err := b.pool.Query(ctx, `SELECT event_id, last_error FROM pgrelay.outbox WHERE status = 'dead'`)
	require.NoError(t, err)
	for rows.Next() {
		var id, reason string
		require.NoError(t, rows.Scan(&id, &reason))
		reasons[id] = reason
	}
	require.NoError(t, rows.Err())
	require.Contains(t, reasons["big"], "too large")
	require.Contains(t, reasons["bad-headers"], "headers must be a JSON object of strings")
	eventually(t, func() bool { return obs.dead.Load() == 2 }, "2 dead events observed")
	require.Equal(t, uint64(2), b.streamMsgs(t))
}

// TestNoStreamForSubjectGoesDead: a subject no stream stores is a permanent
// rejection, not an endless retry.
func TestNoStreamForSubjectGoesDead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pub, err := nats.NewPublisher(ctx, nats.Config{URL: b.natsURL, SubjectPrefix: b.prefix + "nostream", AckTimeout: time.Second})
	require.NoError(t, err)
	defer pub.Close()
	b.enqueue(t, msgs(3, "k", "n")...)
	start(t, b.testConfig(t, pub, &countingObserver{}))
	b.waitCount(t, "dead", 3, 20*time.Second)
	var reason string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT last_error FROM pgrelay.outbox LIMIT 1`).Scan(&reason))
	require.Contains(t, reason, "no stream stores subject")
}

// TestPartitionsShareAndRelease: relays split the partitions fairly, and a
// relay shutting down releases its leases at once.
func TestPartitionsShareAndRelease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pub := b.publisher(t)
	owned := func() map[string]int {
		out := map[string]int{}
		rows, err := b.pool.Query(context.Background(), `SELECT coalesce(owner, '') FROM pgrelay.relay_partitions WHERE lease_until > now()`)
		require.NoError(t, err)
		for rows.Next() {
			var o string
			require.NoError(t, rows.Scan(&o))
			out[o]++
		}
		return out
	}
	a, stopA := start(t, b.testConfig(t, pub, &countingObserver{}))
	require.Eventually(t, func() bool { return owned()[a.NodeID()] == 16 }, 10*time.Second, 10*time.Millisecond)
	c, _ := start(t, b.testConfig(t, pub, &countingObserver{}))
	require.Eventually(t, func() bool { o := owned(); return o[a.NodeID()] == 8 && o[c.NodeID()] == 8 }, 10*time.Second, 10*time.Millisecond)
	stopA()
	// Released, not left to expire: A owns nothing the moment it returns.
	var stillA int
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM pgrelay.relay_partitions WHERE owner = $1`, a.NodeID()).Scan(&stillA))
	require.Zero(t, stillA, "a stopped relay releases its leases")
	require.Eventually(t, func() bool { return owned()[c.NodeID()] == 16 }, 10*time.Second, 10*time.Millisecond)
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM pgrelay.relay_nodes WHERE node_id = $1`, a.NodeID()).Scan(&n))
	require.Zero(t, n)
}

// TestRetentionDeletesPublishedKeepsDead: published rows past the retention
// go in bounded batches; dead and pending rows stay.
func TestRetentionDeletesPublishedKeepsDead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.enqueue(t, msgs(25, "k", "r")...)
	_, err := b.pool.Exec(ctx, `UPDATE pgrelay.outbox SET status = 'published', published_at = now() - interval '2 hours'`)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `INSERT INTO pgrelay.outbox (event_id, topic, key) VALUES ('d', 'orders', 'k')`)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `UPDATE pgrelay.outbox SET status = 'dead', last_error = 'x' WHERE event_id = 'd'`)
	require.NoError(t, err)
	cfg := b.testConfig(t, b.publisher(t), &countingObserver{})
	cfg.Retention = time.Hour
	cfg.RetentionInterval = 50 * time.Millisecond
	cfg.RetentionBatchSize = 10
	start(t, cfg)
	b.waitCount(t, "published", 0, 10*time.Second)
	require.Equal(t, 1, b.count(t, "dead"))
}

func TestConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	pub := &gatedPublisher{}
	pool := &struct{}{}
	_ = pool
	cases := map[string]Config{
		"Config.Pool":              {Publisher: pub},
		"Config.BatchSize":         {BatchSize: -1},
		"Config.HeartbeatInterval": {Lease: time.Second, HeartbeatInterval: time.Second},
		"Config.Lease":             {Lease: time.Millisecond},
		"Config.BackoffMin":        {BackoffMin: time.Second, BackoffMax: time.Millisecond},
	}
	b := setup(t)
	for field, cfg := range cases {
		if field != "Config.Pool" {
			cfg.Pool, cfg.Publisher = b.pool, pub
		}
		_, err := New(cfg)
		require.ErrorContains(t, err, field)
	}
	_, err := New(Config{Pool: b.pool})
	require.ErrorContains(t, err, "Config.Publisher")
	_, err = nats.NewPublisher(context.Background(), nats.Config{})
	require.ErrorContains(t, err, "nats.Config.URL")
	_, err = nats.NewPublisher(context.Background(), nats.Config{URL: "nats://x", SubjectPrefix: "a.*"})
	require.ErrorContains(t, err, "nats.Config.SubjectPrefix")
}

var _ = sort.Ints
var _ = strings.Contains

// panickyObserver panics on its first Published call.
type panickyObserver struct {
	countingObserver
	once sync.Once
}

func (o *panickyObserver) Published(p int, n, dups int, lag time.Duration) {
	o.once.Do(func() { panic("observer bug") })
	o.countingObserver.Published(p, n, dups, lag)
}

// TestWorkerPanicIsContained: a panic in a partition worker (here from the
// Observer) neither crashes the process nor strands the partition: the next
// heartbeat starts a new worker for the lease still held.
func TestWorkerPanicIsContained(t *testing.T) {
	t.Parallel()
	b := setup(t)
	obs := &panickyObserver{}
	cfg := b.testConfig(t, b.publisher(t), obs)
	cfg.PollInterval = time.Hour // only a new worker or a notification looks again
	start(t, cfg)
	b.enqueue(t, msgs(3, "k", "first")...)
	b.waitCount(t, "published", 3, 10*time.Second)
	b.enqueue(t, msgs(3, "k", "second")...)
	b.waitCount(t, "published", 6, 10*time.Second)
	// The observer hears of a batch just after its mark commits.
	require.Eventually(t, func() bool { return obs.published.Load() == 3 }, 10*time.Second, 10*time.Millisecond,
		"the second batch went through a restarted worker")
}

// eventually waits for an observer count: observers hear of a batch just
// after its mark commits, so a count can trail the rows' status briefly.
func eventually(t *testing.T, cond func() bool, msg string) {
	t.Helper()
	require.Eventually(t, cond, 10*time.Second, 5*time.Millisecond, msg)
}
