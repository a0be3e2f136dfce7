package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/logtest"
	"github.com/pgrelay/pgrelay/internal/testcluster"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

func TestParseProcStat(t *testing.T) {
	// A command name with a space and a ')' (as a process title may hold);
	// utime 250, stime 50, cutime 1000, cstime 200 ticks; started 4200 ticks
	// after boot.
	line := "2212 (post gres) x) S 2211 2212 2212 0 -1 4194368 258 0 0 0 250 50 1000 200 20 0 1 0 4200 222687232 2810"
	st, err := parseProcStat(line)
	require.NoError(t, err)
	require.Equal(t, "post gres) x", st.comm)
	require.Equal(t, 2211, st.ppid)
	require.InDelta(t, 2.5, st.utime, 1e-9)
	require.InDelta(t, 0.5, st.stime, 1e-9)
	require.InDelta(t, 10.0, st.cutime, 1e-9)
	require.InDelta(t, 2.0, st.cstime, 1e-9)
	require.InDelta(t, 42.0, st.start, 1e-9)
}

func TestParseMachineCPU(t *testing.T) {
	// user nice system idle iowait irq softirq steal guest guest_nice: the
	// guest time is inside user already, iowait is idle.
	m, err := parseMachineCPU("cpu  1000 10 300 5000 200 5 15 20 400 0\ncpu0 1 2 3 4 5 6 7 8 9 10\nbtime 1\n")
	require.NoError(t, err)
	require.InDelta(t, (1000+10+300+5+15+20)/100.0, m.busy, 1e-9)
	require.InDelta(t, (5000+200)/100.0, m.idle, 1e-9)
}

// TestObserverWithoutCommitTimestamps: on a server with
// track_commit_timestamp off the observer polls, and -observer commit-ts is
// refused.
func TestObserverWithoutCommitTimestamps(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dbs, err := newDatabases(ctx, testdb.ServerURL(t), logtest.New(t))
	if dbs != nil {
		defer dbs.dropAll()
	}
	require.NoError(t, err)
	if dbs.commitTS {
		t.Skip("the test server has track_commit_timestamp on")
	}
	b := &bench{cfg: Config{}.WithDefaults()}
	o, err := b.observerFor(dbs)
	require.NoError(t, err)
	require.Equal(t, observerPoll, o)
	require.True(t, strings.HasPrefix(b.describeObserver(dbs), "poll (track_commit_timestamp off)"), b.describeObserver(dbs))
	b.cfg.Observer = observerCommitTS
	_, err = b.observerFor(dbs)
	require.ErrorContains(t, err, "needs track_commit_timestamp = on")
}

// TestPrivateCluster runs, on a private cluster with track_commit_timestamp
// on, the CPU accounting of PostgreSQL and the commit-timestamp observer.
func TestPrivateCluster(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat(filepath.Join(testcluster.BinDir(), "initdb")); err != nil {
		t.Skipf("no PostgreSQL server binaries for a private cluster: %v", err)
	}
	cl := testcluster.Start(t, "track_commit_timestamp = on")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	log := logtest.NewAt(t, slog.LevelWarn)
	dbs, err := newDatabases(ctx, cl.URL(), log)
	if dbs != nil {
		defer dbs.dropAll()
	}
	require.NoError(t, err)
	require.True(t, dbs.commitTS)
	require.NotZero(t, dbs.postmaster, dbs.postmasterErr)

	// burn makes a backend use CPU and returns its pid and the CPU it used
	// (its /proc utime+stime before and after).
	burn := func(conn *pgx.Conn) (int, float64) {
		var pid int
		require.NoError(t, conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
		before, err := readProcStat(pid)
		require.NoError(t, err)
		var n int64
		require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM generate_series(1, 4000000)").Scan(&n))
		after, err := readProcStat(pid)
		require.NoError(t, err)
		return pid, after.utime + after.stime - before.utime - before.stime
	}

	t.Run("postgres cpu counts a running backend", func(t *testing.T) {
		conn, err := pgx.Connect(ctx, cl.URL())
		require.NoError(t, err)
		defer conn.Close(context.Background())
		before, err := postgresCPU(dbs.postmaster)
		require.NoError(t, err)
		_, used := burn(conn)
		after, err := postgresCPU(dbs.postmaster)
		require.NoError(t, err)
		require.Greater(t, used, 0.05)
		require.GreaterOrEqual(t, after-before, used-0.02, "server CPU %.2f s, the backend alone used %.2f s", after-before, used)
	})

	t.Run("postgres cpu counts a backend that exited", func(t *testing.T) {
		before, err := postgresCPU(dbs.postmaster)
		require.NoError(t, err)
		conn, err := pgx.Connect(ctx, cl.URL())
		require.NoError(t, err)
		pid, used := burn(conn)
		require.NoError(t, conn.Close(ctx))
		require.Eventually(t, func() bool { _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); return err != nil },
			10*time.Second, 10*time.Millisecond, "backend %d did not exit", pid)
		after, err := postgresCPU(dbs.postmaster)
		require.NoError(t, err)
		require.Greater(t, used, 0.05)
		require.GreaterOrEqual(t, after-before, used-0.02, "server CPU %.2f s, the exited backend used %.2f s", after-before, used)
	})

	t.Run("commit-ts observer times a credit by its commit", func(t *testing.T) {
		b := &bench{cfg: Config{}.WithDefaults(), dbs: dbs}
		o, err := b.observerFor(dbs)
		require.NoError(t, err)
		require.Equal(t, observerCommitTS, o)
		pool, _, err := dbs.fresh(ctx, 2)
		require.NoError(t, err)
		defer pool.Close()
		require.NoError(t, seedOrders(ctx, pool))
		p := &pipeline{b: b, pool: pool, observer: o}
		gen := newGenerator("e2e")
		commitAt, seenAt := make([]int64, 2), make([]int64, 2)
		// Event 0 is "produced" now and credited at once; the credits are
		// read 300 ms later, as after a run, and event 1 was never produced.
		commitAt[0] = time.Now().UnixNano()
		for i := range 2 {
			e := gen.event(i)
			pl, err := parsePaid(e.payload)
			require.NoError(t, err)
			_, err = pool.Exec(ctx, `INSERT INTO ledger_entries (event_id, order_id, customer_id, amount_cents, currency) VALUES ($1, $2, $3, $4, $5)`,
				e.id, pl.OrderID, pl.CustomerID, pl.AmountCents, pl.Currency)
			require.NoError(t, err)
		}
		credited := time.Now().UnixNano()
		time.Sleep(300 * time.Millisecond)
		lat, last, err := p.commitTimes(ctx, gen, commitAt, seenAt)
		require.NoError(t, err)
		require.Len(t, lat, 1)
		require.Less(t, lat[0], 150*time.Millisecond, "latency to the credit's commit, not to when it was read")
		require.Equal(t, seenAt[0], last)
		require.GreaterOrEqual(t, seenAt[0], commitAt[0])
		require.LessOrEqual(t, seenAt[0], credited)
		require.Zero(t, seenAt[1])
	})

	t.Run("end to end with the commit-ts observer", func(t *testing.T) {
		res, err := Run(ctx, Config{
			DatabaseURL: cl.URL(), NATSURL: os.Getenv("NATS_URL"), OutDir: t.TempDir(), BinDir: "/nonexistent",
			Quick: true, Events: 500, LoadDuration: time.Second, TunedMaxWait: -1, Only: []string{"e2e"}, Logger: log,
		})
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(fmt.Sprint(res.Settings["observer"]), "commit-ts (track_commit_timestamp on)"), res.Settings["observer"])
		for _, f := range res.Figures {
			if strings.HasPrefix(f.ID, "cpu_") {
				continue // checked by TestQuick
			}
			require.Empty(t, f.Error, "figure %s", f.ID)
			require.NotEmpty(t, f.Samples, "figure %s", f.ID)
			if strings.HasPrefix(f.ID, "stage_") {
				continue // the consumer's store may start before the mark's transaction
			}
			require.Greater(t, f.Median, 0.0, "figure %s", f.ID)
		}
		require.NotEmpty(t, res.lookup(cpuFigureID("load_200", cpuPostgres)).Samples)
	})
}

// TestFindNATSServer finds the process listening on the URL's port (here
// this test's own listener) and refuses a server on another host.
func TestFindNATSServer(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	pid, err := findNATSServer(fmt.Sprintf("nats://127.0.0.1:%d", l.Addr().(*net.TCPAddr).Port))
	require.NoError(t, err)
	require.Equal(t, os.Getpid(), pid)
	_, err = findNATSServer("nats://192.0.2.1:4222")
	require.ErrorContains(t, err, "not on this machine")
}
