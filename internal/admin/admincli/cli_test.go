package admincli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/spf13/cobra"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/admin"
	"github.com/pgrelay/pgrelay/internal/admin/admincli"
	"github.com/pgrelay/pgrelay/internal/admin/admintest"
	"github.com/pgrelay/pgrelay/internal/pgurl"
	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/migrations"
)

// runCLI runs the operator subcommands against the database at url, as the
// binaries do, and returns stdout and the error.
func runCLI(t *testing.T, url string, args ...string) (string, error) {
	t.Helper()
	return runCLIOn(t, pgurl.One(&url), args...)
}

// runCLIOn runs the operator subcommands over the databases dbs lists.
func runCLIOn(t *testing.T, dbs pgurl.Databases, args ...string) (string, error) {
	t.Helper()
	root := &cobra.Command{Use: "consumer", SilenceUsage: true, SilenceErrors: true}
	root.AddCommand(admincli.Commands(dbs)...)
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

func TestCLI(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	svcPool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(svcPool.Close)
	admintest.Fixtures(t, svcPool)

	out, err := runCLI(t, url, "dead", "list")
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 4, out)
	require.True(t, strings.HasPrefix(lines[0], "HANDLER"), out)
	require.Contains(t, lines[1], "d-users-1")

	out, err = runCLI(t, url, "dead", "list", "--topic", "orders", "--error", "eof", "--json")
	require.NoError(t, err)
	var list []admin.DeadLetter
	require.NoError(t, json.Unmarshal([]byte(out), &list), out)
	require.Equal(t, []string{"d-orders-2"}, admintest.IDs(list))

	out, err = runCLI(t, url, "dead", "list", "--key", "d-users-1", "--json") // the fixtures' key is the event id
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal([]byte(out), &list), out)
	require.Equal(t, []string{"d-users-1"}, admintest.IDs(list))

	out, err = runCLI(t, url, "dead", "list", "--since", "50h")
	require.NoError(t, err)
	require.Contains(t, out, "d-orders-1")
	require.NotContains(t, out, "d-users-1")

	out, err = runCLI(t, url, "dead", "show", "d-orders-2")
	require.NoError(t, err)
	require.Contains(t, out, "bad payload: unexpected EOF")
	require.Contains(t, out, `{"n":1}`)
	_, err = runCLI(t, url, "dead", "show", "missing")
	require.ErrorIs(t, err, admin.ErrNotFound)

	before := admintest.Snapshot(t, svcPool)
	_, err = runCLI(t, url, "dead", "requeue", "d-orders-2")
	require.ErrorContains(t, err, "--reason is required")
	_, err = runCLI(t, url, "dead", "requeue", "--reason", "x")
	require.ErrorContains(t, err, "without a filter")
	out, err = runCLI(t, url, "dead", "requeue", "d-orders-2", "--reason", "fixed parser", "--dry-run")
	require.NoError(t, err)
	require.Contains(t, out, "dry run: would have requeued 1")
	_, err = runCLI(t, url, "dead", "purge")
	require.ErrorContains(t, err, "--older-than is required")
	out, err = runCLI(t, url, "dead", "purge", "--older-than", "1h", "--dry-run")
	require.NoError(t, err)
	require.Contains(t, out, "dry run: would have purged 3")
	require.Equal(t, before, admintest.Snapshot(t, svcPool), "dry runs change nothing")

	out, err = runCLI(t, url, "dead", "requeue", "d-orders-2", "--reason", "fixed parser", "--actor", "carol", "--json")
	require.NoError(t, err)
	var res admin.Result
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Equal(t, 1, res.Count)
	st, _, _ := admintest.StatusOf(t, svcPool, "d-orders-2")
	require.Equal(t, "pending", st)

	out, err = runCLI(t, url, "dead", "purge", "--older-than", "60h", "--reason", "stale")
	require.NoError(t, err)
	require.Contains(t, out, "purged 1 dead inbox event(s)")
	st, _, _ = admintest.StatusOf(t, svcPool, "d-users-1")
	require.Equal(t, "absent", st)

	out, err = runCLI(t, url, "audit")
	require.NoError(t, err)
	require.Contains(t, out, "carol")
	require.Contains(t, out, "purge")

	out, err = runCLI(t, url, "stats")
	require.NoError(t, err)
	require.Contains(t, out, "dead")
	require.Contains(t, out, "unknown (pass --metrics-url)")

	// The dedup hit rate from a consumer's metrics endpoint.
	ms := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("# TYPE consumer_received_total counter\nconsumer_received_total 40\n# TYPE consumer_dedup_total counter\nconsumer_dedup_total 10\n"))
	}))
	defer ms.Close()
	out, err = runCLI(t, url, "stats", "--metrics-url", ms.URL, "--json")
	require.NoError(t, err)
	var stats admin.Stats
	require.NoError(t, json.Unmarshal([]byte(out), &stats), out)
	require.NotNil(t, stats.Dedup)
	require.InDelta(t, 0.25, stats.Dedup.HitRate, 1e-9)
	require.Equal(t, int64(1), stats.Inbox.ByStatus["dead"])

	// An unreachable metrics endpoint leaves the rate unknown, not the command failed.
	ms.Close()
	out, err = runCLI(t, url, "stats", "--metrics-url", ms.URL)
	require.NoError(t, err)
	require.Contains(t, out, "dedup hit rate")
	require.Contains(t, out, "unknown")

	_, err = runCLI(t, "", "stats")
	require.ErrorContains(t, err, "DATABASE_URL")
}

// TestCLIStatsEachDatabase: given several databases (a file, as relay's
// --databases-file) and no --database, stats prints each database's stats,
// headed by its name, in the file's order.
func TestCLIStatsEachDatabase(t *testing.T) {
	t.Parallel()
	withDead, empty := testdb.NewURL(t), testdb.NewURL(t)
	pool, err := pgxpool.New(context.Background(), withDead)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	admintest.Fixtures(t, pool)
	// billing one migration behind.
	emptyPool, err := pgxpool.New(context.Background(), empty)
	require.NoError(t, err)
	t.Cleanup(emptyPool.Close)
	sqlDB := stdlib.OpenDBFromPool(emptyPool)
	defer sqlDB.Close()
	p, err := migrations.NewProvider(sqlDB)
	require.NoError(t, err)
	sources := p.ListSources()
	last, before := sources[len(sources)-1].Version, sources[len(sources)-2].Version
	_, err = p.Down(context.Background())
	require.NoError(t, err)
	file := filepath.Join(t.TempDir(), "dbs")
	require.NoError(t, os.WriteFile(file, []byte("# two\norders="+withDead+"\n\nbilling="+empty+"\n"), 0o600))

	fromFile := func() ([]pgurl.Named, error) { return pgurl.ReadNamed(file, "--databases-file") }
	out, err := runCLIOn(t, fromFile, "stats", "--json")
	require.NoError(t, err)
	var each []struct {
		Database string      `json:"database"`
		Stats    admin.Stats `json:"stats"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &each), out)
	require.Len(t, each, 2, out)
	require.Equal(t, "orders", each[0].Database)
	require.Equal(t, "billing", each[1].Database)
	require.Equal(t, int64(3), each[0].Stats.Inbox.ByStatus["dead"])
	require.Zero(t, each[1].Stats.Inbox.ByStatus["dead"])

	out, err = runCLIOn(t, fromFile, "stats")
	require.NoError(t, err)
	require.Regexp(t, `(?s)^== orders\n.*\n\n== billing\n`, out)
	require.Regexp(t, fmt.Sprintf(`(?s)== orders\n.*schema version +%d \(latest\)\n.*== billing\n.*schema version +%d, behind latest %d \(pending: %d\)\n`,
		last, before, last, last), out)
	require.Equal(t, []int64{last}, each[1].Stats.Schema.Pending)

	require.NoError(t, os.WriteFile(file, []byte("orders="+withDead+"\nbad name=x\n"), 0o600))
	_, err = runCLIOn(t, fromFile, "stats")
	require.ErrorContains(t, err, "--databases-file "+file+`:2: name "bad name" must be`)
}

// TestCLIConfirm: the dry run's --confirm token purges exactly the events the
// dry run showed: refused when a third went dead in between.
func TestCLIConfirm(t *testing.T) {
	t.Parallel()
	url := testdb.NewURL(t)
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	admintest.Fixtures(t, pool)
	tokenRe := regexp.MustCompile(`--confirm (\S+) \(until `)
	review := func() string {
		t.Helper()
		out, err := runCLI(t, url, "dead", "purge", "--topic", "orders", "--older-than", "0s", "--actor", "ops", "--dry-run")
		require.NoError(t, err)
		m := tokenRe.FindStringSubmatch(out)
		require.NotNil(t, m, out)
		return m[1]
	}
	token := review()
	_, err = pool.Exec(context.Background(), `UPDATE pgrelay.inbox SET status = 'dead', finished_at = now() WHERE event_id = 'q-orders-1'`)
	require.NoError(t, err)
	before := admintest.Snapshot(t, pool)
	_, err = runCLI(t, url, "dead", "purge", "--topic", "orders", "--older-than", "0s", "--actor", "ops", "--confirm", token)
	require.ErrorIs(t, err, admin.ErrStale)
	require.ErrorContains(t, err, "not the 2 reviewed")
	require.Equal(t, before, admintest.Snapshot(t, pool))

	out, err := runCLI(t, url, "dead", "purge", "--topic", "orders", "--older-than", "0s", "--actor", "ops", "--confirm", review())
	require.NoError(t, err)
	require.Contains(t, out, "purged 3 dead inbox event(s)")
}
