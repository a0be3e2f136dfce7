package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/testdb"
)

// TestDatabaseSettingsRefuseAmbiguity: a URL given twice, or two URLs
// naming one database, are refused naming the settings.
func TestDatabaseSettingsRefuseAmbiguity(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	ctx := context.Background()
	u := "postgres://127.0.0.1:1/orders"
	require.ErrorContains(t, execute(ctx, "run", "--database-url", u, "--database-url", u),
		"one URL is given twice: as orders (--database-url (DATABASE_URL)) and as orders (--database-url (DATABASE_URL))")
	require.ErrorContains(t, execute(ctx, "run", "--database-url", u, "--database-url", "postgres://127.0.0.2:1/orders"),
		"database orders is named twice: by --database-url (DATABASE_URL) and by --database-url (DATABASE_URL)")
	file := filepath.Join(t.TempDir(), "dbs")
	require.NoError(t, os.WriteFile(file, []byte("# the shop\norders=postgres://127.0.0.3:1/x\nbad name=postgres://x/y\n"), 0o600))
	require.ErrorContains(t, execute(ctx, "run", "--databases-file", file), file+`:3: name "bad name" must be`)
	require.NoError(t, os.WriteFile(file, []byte("orders=postgres://127.0.0.3:1/x\n"), 0o600))
	require.ErrorContains(t, execute(ctx, "run", "--database-url", u, "--databases-file", file),
		"database orders is named twice: by --database-url (DATABASE_URL) and by --databases-file (RELAY_DATABASES_FILE) "+file+":1")
}

// TestRelayProcessServesManyDatabases runs relay run as a real process over
// a database given by --database-url and one named in --databases-file;
// after the file is rewritten and SIGHUP sent, the removed database's leases
// are released and the added one is published.
func TestRelayProcessServesManyDatabases(t *testing.T) {
	pools := []*pgxpool.Pool{testdb.New(t), testdb.New(t), testdb.New(t)}
	url := func(i int) string { return pools[i].Config().ConnString() }
	file := filepath.Join(t.TempDir(), "databases")
	require.NoError(t, os.WriteFile(file, []byte("# served by this relay\nsecond="+url(1)+"\n"), 0o600))

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "RELAY_MAIN_ARGS=run --nats-url= --embedded-nats-listen 127.0.0.1:0 --embedded-nats-dir "+t.TempDir()+
		" --log-format console --poll-interval 100ms --database-url "+url(0)+" --databases-file "+file,
		"DATABASE_URL=", "METRICS_ADDR=127.0.0.1:0", "ADMIN_ADDR=")
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			t.Log(sc.Text())
		}
	}()
	count := func(i int, q string) int {
		var n int
		_ = pools[i].QueryRow(context.Background(), q).Scan(&n)
		return n
	}
	const published = `SELECT count(*) FROM pgrelay.outbox WHERE status = 'published'`
	const owned = `SELECT count(*) FROM pgrelay.relay_partitions WHERE owner IS NOT NULL`
	insert := func(i int) {
		_, err := pools[i].Exec(context.Background(), `INSERT INTO pgrelay.outbox (topic, key, payload) VALUES ('orders', $1, 'x')`, fmt.Sprint(i))
		require.NoError(t, err)
	}
	insert(0)
	insert(1)
	for i := range 2 {
		require.Eventually(t, func() bool { return count(i, published) == 1 }, 30*time.Second, 20*time.Millisecond, "database %d published", i)
		require.Equal(t, 16, count(i, owned))
	}

	require.NoError(t, os.WriteFile(file, []byte("third="+url(2)+"\n"), 0o600))
	require.NoError(t, cmd.Process.Signal(syscall.SIGHUP))
	insert(2)
	require.Eventually(t, func() bool { return count(2, published) == 1 }, 30*time.Second, 20*time.Millisecond, "the added database is published")
	require.Eventually(t, func() bool { return count(1, owned) == 0 }, 10*time.Second, 20*time.Millisecond, "the removed database's leases are released")
	insert(0)
	require.Eventually(t, func() bool { return count(0, published) == 2 }, 30*time.Second, 20*time.Millisecond, "the database kept is still published")

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait(), "a SIGTERM is a clean exit")
	for _, i := range []int{0, 2} {
		require.Zero(t, count(i, owned), "leases released")
	}
}

// TestMaxConnsTotal: databases whose pools together exceed
// --max-conns-total are refused at start, naming it.
func TestMaxConnsTotal(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	args := []string{"run", "--max-conns-total", "100"}
	for range 3 {
		args = append(args, "--database-url", testdb.NewURL(t))
	}
	require.ErrorContains(t, execute(context.Background(), args...),
		"3 databases need up to 114 connections (each pool's pool_max_conns, at least 36, plus its LISTEN and lock connections), over --max-conns-total (RELAY_MAX_CONNS_TOTAL) 100")
}
