package guard_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/guard"
	"github.com/pgrelay/pgrelay/internal/logtest"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// redisClient returns a client on REDIS_URL; without it the test fails under
// CI and is skipped elsewhere.
func redisClient(t *testing.T) *redis.Client { return redisClientTB(t) }

func redisClientTB(t testing.TB) *redis.Client {
	t.Helper()
	u := os.Getenv("REDIS_URL")
	if u == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("guard: REDIS_URL is not set under CI; point it at a Redis, e.g. redis://127.0.0.1:6379/0")
		}
		t.Skip("guard: set REDIS_URL (e.g. redis://127.0.0.1:6379/0) to run the Redis store tests")
	}
	opt, err := redis.ParseURL(u)
	require.NoError(t, err, "REDIS_URL")
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, c.Ping(ctx).Err(), "REDIS_URL %s", u)
	return c
}

func prefix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "pgrelay-test-" + hex.EncodeToString(b[:]) + ":"
}

var stores = map[string]func(t *testing.T) guard.Store{
	"postgres": func(t *testing.T) guard.Store { return guard.NewPostgresStore(testdb.New(t)) },
	"redis":    func(t *testing.T) guard.Store { return guard.NewRedisStore(redisClient(t), prefix()) },
}

// forEachStore runs one test body against every store.
func forEachStore(t *testing.T, f func(t *testing.T, g *guard.Guard, store guard.Store)) {
	for name, mk := range stores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := mk(t)
			g, err := guard.New(guard.Config{Store: s, Registerer: prometheus.NewRegistry()})
			require.NoError(t, err)
			f(t, g, s)
		})
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestReserveConfirmRelease(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, g *guard.Guard, _ guard.Store) {
		c := ctx(t)
		r, err := g.Reserve(c, "email:welcome:42", time.Minute)
		require.NoError(t, err)
		_, err = g.Reserve(c, "email:welcome:42", time.Minute)
		require.ErrorIs(t, err, guard.ErrInProgress)
		require.NoError(t, r.Release(c))
		require.ErrorIs(t, r.Release(c), guard.ErrLeaseLost, "released once")

		r, err = g.Reserve(c, "email:welcome:42", time.Minute)
		require.NoError(t, err, "a released key is free")
		require.NoError(t, r.Extend(c, 2*time.Minute))
		require.NoError(t, r.Confirm(c))
		_, err = g.Reserve(c, "email:welcome:42", time.Minute)
		require.ErrorIs(t, err, guard.ErrDuplicate)
		checks, dups := g.Checks()
		require.EqualValues(t, 4, checks)
		require.EqualValues(t, 2, dups)
	})
}

// TestLeaseExpiry: a lease that ends lets a second holder in (the window a
// crash leaves), the first holder can then neither extend nor confirm, and
// KeepAlive prevents the expiry for a long effect.
func TestLeaseExpiry(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, g *guard.Guard, _ guard.Store) {
		c := ctx(t)
		first, err := g.Reserve(c, "charge:7", 150*time.Millisecond)
		require.NoError(t, err)
		var second *guard.Reservation
		require.Eventually(t, func() bool {
			second, err = g.Reserve(c, "charge:7", time.Minute)
			return err == nil
		}, 5*time.Second, 20*time.Millisecond)
		require.ErrorIs(t, first.Extend(c, time.Minute), guard.ErrLeaseLost)
		require.ErrorIs(t, first.Confirm(c), guard.ErrLeaseLost)
		require.NoError(t, second.Confirm(c))

		// A long effect, three leases long; the lease is generous against a
		// loaded machine's scheduling delays (renewed every third of it).
		const lease = 900 * time.Millisecond
		long, err := g.Reserve(c, "report:long", lease)
		require.NoError(t, err)
		stop := long.KeepAlive(c, lease)
		deadline := time.Now().Add(3 * lease)
		for time.Now().Before(deadline) {
			_, err := g.Reserve(c, "report:long", time.Minute)
			require.ErrorIs(t, err, guard.ErrInProgress)
			time.Sleep(100 * time.Millisecond)
		}
		require.NoError(t, stop())
		require.NoError(t, long.Confirm(c))
	})
}

// TestWebhookDeliveredThreeTimes: the same webhook arrives three times at
// once; the guard lets exactly one delivery run the effect.
func TestWebhookDeliveredThreeTimes(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, g *guard.Guard, _ guard.Store) {
		c := ctx(t)
		var effects atomic.Int32
		deliver := func() error {
			r, err := g.Reserve(c, "webhook:evt_1NqL", time.Minute)
			if err != nil {
				return err
			}
			effects.Add(1) // e.g. call the payment provider
			return r.Confirm(c)
		}
		var wg sync.WaitGroup
		errs := make(chan error, 3)
		for range 3 {
			wg.Add(1)
			go func() { defer wg.Done(); errs <- deliver() }()
		}
		wg.Wait()
		close(errs)
		var ok, refused int
		for err := range errs {
			if err == nil {
				ok++
				continue
			}
			require.True(t, isRefusal(err), "%v", err)
			refused++
		}
		require.Equal(t, 1, ok)
		require.Equal(t, 2, refused)
		require.EqualValues(t, 1, effects.Load())
		require.ErrorIs(t, deliver(), guard.ErrDuplicate, "a later redelivery is a duplicate")
	})
}

func isRefusal(err error) bool {
	return err == guard.ErrDuplicate || err == guard.ErrInProgress
}

// TestScheduledJobOverlap: two overlapping runs of a job keyed by its date;
// one runs, the other finds the key held, and the next tick finds it done.
func TestScheduledJobOverlap(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, g *guard.Guard, _ guard.Store) {
		c := ctx(t)
		key := "job:nightly-invoices:2026-11-22"
		started, finish := make(chan struct{}), make(chan struct{})
		var runs atomic.Int32
		run := func(signal bool) error {
			r, err := g.Reserve(c, key, time.Minute)
			if err != nil {
				return err
			}
			runs.Add(1)
			if signal {
				close(started)
				<-finish
			}
			return r.Confirm(c)
		}
		done := make(chan error, 1)
		go func() { done <- run(true) }()
		<-started
		require.ErrorIs(t, run(false), guard.ErrInProgress, "the overlapping run is refused")
		close(finish)
		require.NoError(t, <-done)
		require.ErrorIs(t, run(false), guard.ErrDuplicate, "the day's run is done")
		require.EqualValues(t, 1, runs.Load())
		r, err := g.Reserve(c, "job:nightly-invoices:2026-11-23", time.Minute)
		require.NoError(t, err, "the next day runs")
		require.NoError(t, r.Confirm(c))
	})
}

// TestRedisDown points a Redis store at a closed port: fail closed refuses
// the effect with ErrUnavailable; fail open lets it through unguarded and
// logs it at error level.
func TestRedisDown(t *testing.T) {
	t.Parallel()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 500 * time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	store := guard.NewRedisStore(c, "guard:")

	closed, err := guard.New(guard.Config{Store: store})
	require.NoError(t, err)
	_, err = closed.Reserve(ctx(t), "webhook:1", time.Minute)
	require.ErrorIs(t, err, guard.ErrUnavailable)
	t.Logf("fail closed: %v", err)

	core, logs := logtest.Observe(slog.LevelError)
	reg := prometheus.NewRegistry()
	open, err := guard.New(guard.Config{Store: store, FailOpen: true, Logger: core, Registerer: reg})
	require.NoError(t, err)
	r, err := open.Reserve(ctx(t), "webhook:1", time.Minute)
	require.NoError(t, err)
	require.True(t, r.Unguarded)
	require.NoError(t, r.Confirm(ctx(t)))
	require.Equal(t, 1, logs.FilterMessageSnippet("FAILING OPEN").Len())
	require.Equal(t, 1.0, testutil.ToFloat64(counter(t, reg, "pgrelay_guard_fail_open_total")))
}

func counter(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: name}, func() float64 {
				var s float64
				for _, m := range mf.GetMetric() {
					s += m.GetCounter().GetValue()
				}
				return s
			})
		}
	}
	t.Fatalf("no metric %s", name)
	return nil
}

// TestMetrics: checks by result, duplicates, hit ratio, active keys, storage
// bytes (PostgreSQL) and the two histograms are exported.
func TestMetrics(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	s := guard.NewPostgresStore(pool)
	reg := prometheus.NewRegistry()
	g, err := guard.New(guard.Config{Store: s, Registerer: reg})
	require.NoError(t, err)
	c := ctx(t)
	r, err := g.Reserve(c, "k", time.Minute)
	require.NoError(t, err)
	require.NoError(t, r.Confirm(c))
	_, err = g.Reserve(c, "k", time.Minute)
	require.ErrorIs(t, err, guard.ErrDuplicate)

	mfs, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch {
			case m.GetGauge() != nil:
				got[mf.GetName()] = m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				got[mf.GetName()] = float64(m.GetHistogram().GetSampleCount())
			case m.GetCounter() != nil:
				got[mf.GetName()] += m.GetCounter().GetValue()
			}
		}
	}
	require.Equal(t, 2.0, got["pgrelay_guard_checks_total"])
	require.Equal(t, 1.0, got["pgrelay_guard_duplicates_total"])
	require.Equal(t, 0.5, got["pgrelay_guard_hit_ratio"])
	require.Equal(t, 1.0, got["pgrelay_guard_active_keys"])
	require.Greater(t, got["pgrelay_guard_storage_bytes"], 0.0)
	require.Equal(t, 2.0, got["pgrelay_guard_check_duration_seconds"])
	require.Equal(t, 2.0, got["pgrelay_guard_lease_ttl_seconds"])

	_, err = pool.Exec(c, `INSERT INTO pgrelay.guard_keys (key, token, state, expires_at)
		SELECT 'old-' || g, 't', 'confirmed', now() - interval '1 minute' FROM generate_series(1, 25) g`)
	require.NoError(t, err)
	n, err := s.Clean(c, 10, time.Second)
	require.NoError(t, err)
	require.EqualValues(t, 25, n, "three batches of at most 10")
	var left int
	require.NoError(t, pool.QueryRow(c, `SELECT count(*) FROM pgrelay.guard_keys`).Scan(&left))
	require.Equal(t, 1, left, "the confirmed, unexpired key is kept")
}

func TestConfig(t *testing.T) {
	_, err := guard.New(guard.Config{})
	require.ErrorContains(t, err, "Store or Pool")
	_, err = guard.New(guard.Config{Store: guard.NewRedisStore(nil, ""), Timeout: -1})
	require.ErrorContains(t, err, "Timeout")
}

// TestInvalidKeys: a key PostgreSQL text cannot hold (a NUL byte, invalid
// UTF-8) is refused up front with ErrInvalidKey by every store alike, never
// reported as ErrUnavailable (a retry can never succeed), and FailOpen never
// lets the effect run unguarded for it.
func TestInvalidKeys(t *testing.T) {
	t.Parallel()
	bad := map[string]string{
		"NUL":          "webhook:\x00:1",
		"invalid UTF8": "webhook:\xff\xfe",
		"cut rune":     "job:caf\xc3",
		"empty":        "",
		"too long":     string(make([]byte, 513)),
	}
	for name, mk := range stores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := mk(t)
			for _, failOpen := range []bool{false, true} {
				reg := prometheus.NewRegistry()
				g, err := guard.New(guard.Config{Store: s, FailOpen: failOpen, Registerer: reg})
				require.NoError(t, err)
				for what, key := range bad {
					ran := false
					r, err := g.Reserve(ctx(t), key, time.Minute)
					if err == nil {
						ran = true // the caller would run the effect now
					}
					require.ErrorIs(t, err, guard.ErrInvalidKey, "%s (fail open %v)", what, failOpen)
					require.NotErrorIs(t, err, guard.ErrUnavailable, "%s: a retry cannot fix the input", what)
					require.Nil(t, r)
					require.False(t, ran, "%s: the effect must not run", what)
				}
				require.Equal(t, 0.0, testutil.ToFloat64(counter(t, reg, "pgrelay_guard_fail_open_total")))
			}
			// The same keys made valid work in every store.
			g, err := guard.New(guard.Config{Store: s})
			require.NoError(t, err)
			r, err := g.Reserve(ctx(t), "webhook:café:✓", time.Minute)
			require.NoError(t, err)
			require.NoError(t, r.Confirm(ctx(t)))
		})
	}
}
