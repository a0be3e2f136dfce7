package notifier

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/internal/wait"
)

// recorder collects the notifications of each channel and the PIDs of the
// connections that listened.
type recorder struct {
	mu       sync.Mutex
	got      map[string][]string
	pids     []uint32
	listened int
}

func (r *recorder) topic(channel string) Topic {
	return Topic{Channel: channel, Notify: func(p string) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.got[channel] = append(r.got[channel], p)
	}}
}

func (r *recorder) payloads(channel string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.got[channel]...)
}

func (r *recorder) lastPID() (uint32, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.pids) == 0 {
		return 0, r.listened
	}
	return r.pids[len(r.pids)-1], r.listened
}

func start(t *testing.T, pool *pgxpool.Pool, r *recorder, channels ...string) {
	t.Helper()
	cfg := Config{Pool: pool, Backoff: wait.Policy{Min: 10 * time.Millisecond, Max: 50 * time.Millisecond},
		OnListen: func() { r.mu.Lock(); r.listened++; r.mu.Unlock() }}
	for _, c := range channels {
		cfg.Topics = append(cfg.Topics, r.topic(c))
	}
	n, err := New(cfg)
	require.NoError(t, err)
	n.listening = func(pid uint32) { r.mu.Lock(); r.pids = append(r.pids, pid); r.mu.Unlock() }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); n.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// TestDeliversEachChannelToItsTopic: notifications reach the function of
// their own channel, payload included, and OnListen runs once listening.
func TestDeliversEachChannelToItsTopic(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	r := &recorder{got: map[string][]string{}}
	start(t, pool, r, OutboxChannel, RelaysChannel)
	require.Eventually(t, func() bool { _, n := r.lastPID(); return n == 1 }, 10*time.Second, 5*time.Millisecond)

	ctx := context.Background()
	_, err := pool.Exec(ctx, `SELECT pg_notify($1, '3,7'), pg_notify($2, 'left a'), pg_notify($3, 'x')`,
		OutboxChannel, RelaysChannel, InboxChannel)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return len(r.payloads(OutboxChannel)) == 1 && len(r.payloads(RelaysChannel)) == 1
	}, 10*time.Second, 5*time.Millisecond)
	require.Equal(t, []string{"3,7"}, r.payloads(OutboxChannel))
	require.Equal(t, []string{"left a"}, r.payloads(RelaysChannel))
	require.Empty(t, r.payloads(InboxChannel), "a channel not subscribed is not listened on")
}

// TestListensAgainAfterTheConnectionIsKilled: the listening connection is
// terminated; the notifier dials a new one, calls OnListen again (the
// service looks for work missed meanwhile), and notifications flow again.
func TestListensAgainAfterTheConnectionIsKilled(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	r := &recorder{got: map[string][]string{}}
	start(t, pool, r, InboxChannel)
	var first uint32
	require.Eventually(t, func() bool { first, _ = r.lastPID(); return first != 0 }, 10*time.Second, 5*time.Millisecond)

	ctx := context.Background()
	_, err := pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, int64(first))
	require.NoError(t, err)
	require.Eventually(t, func() bool { pid, n := r.lastPID(); return pid != first && n == 2 },
		10*time.Second, 5*time.Millisecond, "the notifier never listened again")
	_, err = pool.Exec(ctx, `SELECT pg_notify($1, 'after')`, InboxChannel)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(r.payloads(InboxChannel)) == 1 }, 10*time.Second, 5*time.Millisecond)
}

// TestConfigErrorsNameTheField: a missing pool, no topic, or a channel that
// would need quoting is refused, naming the field.
func TestConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	_, err := New(Config{})
	require.ErrorContains(t, err, "Config.Pool is required")
	require.ErrorContains(t, err, "Config.Topics needs at least one channel")
	_, err = New(Config{Pool: &pgxpool.Pool{}, Topics: []Topic{{Channel: `x"; DROP`, Notify: func(string) {}}}})
	require.ErrorContains(t, err, "Config.Topics[0]")
	_, err = New(Config{Pool: &pgxpool.Pool{}, Topics: []Topic{{Channel: "ok_1"}}})
	require.ErrorContains(t, err, "Config.Topics[0]")
	_, err = New(Config{Pool: &pgxpool.Pool{}, Topics: []Topic{{Channel: InboxChannel, Notify: func(string) {}}}})
	require.NoError(t, err)
}
