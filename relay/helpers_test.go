package relay

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/exampleenv"
	"github.com/pgrelay/pgrelay/internal/logtest"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/nats"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/internal/testnats"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		os.Exit(runChild())
	}
	if os.Getenv(walChildEnv) == "1" {
		os.Exit(runWALChild())
	}
	// The Example functions get a migrated database of their own and a
	// NATS server (internal/exampleenv).
	exampleenv.Main(m, true)
}

// bundle is what most relay tests need: a fresh database, a NATS server and
// a stream of their own.
type bundle struct {
	pool    *pgxpool.Pool
	dbURL   string
	natsURL string
	stream  string
	prefix  string
	js      jetstream.JetStream
}

func setup(t *testing.T) *bundle { return setupB(t) }

func setupB(t testing.TB) *bundle {
	t.Helper()
	dbURL := testdb.NewURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	natsURL := testnats.URL(t)
	stream, prefix := testnats.Stream(t, natsURL)
	_, js := testnats.Connect(t, natsURL)
	return &bundle{pool: pool, dbURL: dbURL, natsURL: natsURL, stream: stream, prefix: prefix, js: js}
}

func (b *bundle) publisher(t *testing.T) *nats.Publisher { return b.publisherB(t) }

func (b *bundle) publisherB(t testing.TB) *nats.Publisher {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := nats.NewPublisher(ctx, nats.Config{URL: b.natsURL, SubjectPrefix: b.prefix, Stream: b.stream, AckTimeout: 2 * time.Second, ReconnectWait: 50 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// testConfig is a relay config with short timings for tests.
// A nil t gives a silent logger.
func (b *bundle) testConfig(t *testing.T, pub broker.Publisher, obs relayObserver) Config {
	log := slog.New(slog.DiscardHandler)
	if t != nil {
		log = logtest.NewAt(t, slog.LevelWarn)
	}
	return Config{
		Pool:              b.pool,
		Publisher:         pub,
		log:               log,
		obs:               obs,
		Lease:             time.Second,
		HeartbeatInterval: 200 * time.Millisecond,
		PollInterval:      200 * time.Millisecond,
		QueryTimeout:      5 * time.Second,
		PublishTimeout:    5 * time.Second,
		BackoffMin:        20 * time.Millisecond,
		BackoffMax:        300 * time.Millisecond,
	}
}

// runUntilStopped runs run until the returned stop (or the test's end),
// which waits for it to return nil.
func runUntilStopped(t *testing.T, node string, run func(context.Context) error) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				t.Errorf("relay %s did not stop", node)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// start runs a relay until the returned stop is called (or the test ends).
func start(t *testing.T, cfg Config) (r *engine, stop func()) {
	t.Helper()
	r, err := newEngine(cfg)
	require.NoError(t, err)
	// The Relay sets it from the database's schema (noteSchema); the tests'
	// engines run on the latest.
	r.floorReady.Store(true)
	stop = runUntilStopped(t, r.NodeID(), r.run)
	return r, stop
}

func (b *bundle) enqueue(t testing.TB, msgs ...pgrelay.Message) {
	t.Helper()
	o, err := pgrelay.NewOutbox(pgrelay.OutboxConfig{})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return o.Enqueue(ctx, tx, msgs...) }))
}

func (b *bundle) count(t testing.TB, status string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM pgrelay.outbox WHERE status = $1`, status).Scan(&n))
	return n
}

func (b *bundle) waitCount(t *testing.T, status string, n int, within time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool { return b.count(t, status) == n }, within, 10*time.Millisecond,
		"want %d %s rows", n, status)
}

func (b *bundle) streamMsgs(t *testing.T) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := b.js.Stream(ctx, b.stream)
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	return info.State.Msgs
}

// received is one message read back from the stream.
type received struct {
	subject string
	eventID string
	key     string
	seq     int
	headers map[string][]string
	data    []byte
}

// subscribe reads the whole stream, in stream order, with an ordered consumer.
func (b *bundle) subscribe(t *testing.T) <-chan received {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := b.js.OrderedConsumer(ctx, b.stream, jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	out := make(chan received, 100000)
	cc, err := c.Consume(func(m jetstream.Msg) {
		r := received{subject: m.Subject(), headers: m.Headers(), data: m.Data(), eventID: m.Headers().Get(event.HeaderEventID), key: m.Headers().Get(event.HeaderKey)}
		r.seq, _ = strconv.Atoi(string(m.Data()))
		out <- r
	})
	require.NoError(t, err)
	t.Cleanup(cc.Stop)
	return out
}

// countingObserver counts the observer events.
type countingObserver struct {
	published, duplicates, failed, dead, expired, fenced, acquired, takenOver, lost, held atomic.Int64
}

func (o *countingObserver) Published(_ int, n, dups int, _ time.Duration) {
	o.published.Add(int64(n))
	o.duplicates.Add(int64(dups))
}
func (o *countingObserver) PublishDuration(int, int, time.Duration) {}
func (o *countingObserver) PublishFailed(int, int, error)           { o.failed.Add(1) }
func (o *countingObserver) MarkedDead(_ int, n int)                 { o.dead.Add(int64(n)) }
func (o *countingObserver) Expired(_ int, n int)                    { o.expired.Add(int64(n)) }
func (o *countingObserver) Fenced(int)                              { o.fenced.Add(1) }
func (o *countingObserver) StandbyWait(int, time.Time)              {}
func (o *countingObserver) LeaseAcquired(_ int, _ int64, takenOver bool) {
	o.acquired.Add(1)
	if takenOver {
		o.takenOver.Add(1)
	}
}
func (o *countingObserver) LeaseLost(int)        { o.lost.Add(1) }
func (o *countingObserver) PartitionsHeld(n int) { o.held.Store(int64(n)) }

// partitionOf returns the partition of key.
func (b *bundle) partitionOf(t *testing.T, key string) int32 {
	var p int32
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT pgrelay.outbox_partition($1)`, key).Scan(&p))
	return p
}

func (b *bundle) owner(t *testing.T, p int32) (string, int64) {
	var owner *string
	var epoch int64
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT owner, epoch FROM pgrelay.relay_partitions WHERE partition = $1`, p).Scan(&owner, &epoch))
	if owner == nil {
		return "", epoch
	}
	return *owner, epoch
}

func msgs(n int, key string, prefix string) []pgrelay.Message {
	out := make([]pgrelay.Message, n)
	for i := range out {
		out[i] = pgrelay.Message{EventID: fmt.Sprintf("%s-%d", prefix, i), Topic: "orders", Key: key, EventType: "OrderCreated", Payload: []byte(strconv.Itoa(i + 1))}
	}
	return out
}

func newOutboxForTest() (*pgrelay.Outbox, error) { return pgrelay.NewOutbox(pgrelay.OutboxConfig{}) }
