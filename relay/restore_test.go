package relay

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/pgurl"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// pgTool finds a PostgreSQL client program on PATH or in the usual Debian
// location.
func pgTool(t *testing.T, name string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/" + name)
	if len(matches) == 0 {
		t.Skipf("%s not found on PATH or in /usr/lib/postgresql/*/bin", name)
	}
	return matches[len(matches)-1]
}

// TestDumpRestoreMidBacklogResumes: a database dumped with pg_dump while a
// backlog is pending restores with pg_restore into a fresh database (which
// runs with an empty search_path), and a relay on the restored copy drains
// the backlog in per-key order; producers can write to it as before.
func TestDumpRestoreMidBacklogResumes(t *testing.T) {
	t.Parallel()
	pgDump, pgRestore := pgTool(t, "pg_dump"), pgTool(t, "pg_restore")
	b := setup(t)
	_, stop := start(t, b.testConfig(t, b.publisher(t), &countingObserver{}))
	const keys, perKey = 3, 40
	for k := range keys {
		b.enqueue(t, msgs(perKey/2, fmt.Sprintf("k%d", k), fmt.Sprintf("a%d", k))...)
	}
	b.waitCount(t, "published", keys*perKey/2, 10*time.Second)
	stop()
	for k := range keys {
		later := msgs(perKey, fmt.Sprintf("k%d", k), fmt.Sprintf("b%d", k))[perKey/2:]
		b.enqueue(t, later...)
	}
	require.Equal(t, keys*perKey/2, b.count(t, "pending"))

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dump := filepath.Join(t.TempDir(), "pgrelay.dump")
	out, err := exec.CommandContext(ctx, pgDump, "-Fc", "-f", dump, "-d", b.dbURL).CombinedOutput()
	require.NoError(t, err, "pg_dump: %s", out)

	admin, err := pgx.Connect(ctx, testdb.ServerURL(t))
	require.NoError(t, err)
	defer admin.Close(context.Background())
	name := fmt.Sprintf("pgrelay_restore_%d", time.Now().UnixNano())
	_, err = admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" TEMPLATE template0")
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	})
	restoredURL := pgurl.WithDatabase(testdb.ServerURL(t), name)
	out, err = exec.CommandContext(ctx, pgRestore, "--exit-on-error", "--no-owner", "-d", restoredURL, dump).CombinedOutput()
	require.NoError(t, err, "pg_restore: %s", out)

	restored, err := pgxpool.New(ctx, restoredURL)
	require.NoError(t, err)
	t.Cleanup(restored.Close)
	rb := *b
	rb.pool = restored
	rb.dbURL = restoredURL
	require.Equal(t, keys*perKey/2, rb.count(t, "pending"), "the backlog survived the restore")
	// Leases held by the relay that wrote the dump are expired or released;
	// a relay on the restored copy takes them.
	sub := rb.subscribe(t)
	start(t, rb.testConfig(t, rb.publisher(t), &countingObserver{}))
	rb.enqueue(t, msgs(1, "k0", "after-restore")...) // a producer writes as before
	rb.waitCount(t, "pending", 0, 30*time.Second)
	require.Equal(t, keys*perKey+1, rb.count(t, "published"))

	last := map[string]int{}
	want := keys*perKey + 1
	for seen := 0; seen < want; seen++ {
		select {
		case r := <-sub:
			if r.eventID == "after-restore-0" {
				require.Equal(t, perKey, last[r.key], "the new event follows the restored backlog")
				continue
			}
			require.Equal(t, last[r.key]+1, r.seq, "key %s out of order at %s", r.key, r.eventID)
			last[r.key] = r.seq
		case <-time.After(10 * time.Second):
			t.Fatalf("only %d of %d messages in the stream", seen, want)
		}
	}
	for k := range keys {
		require.Equal(t, perKey, last[fmt.Sprintf("k%d", k)])
	}
	_ = os.Remove(dump)
}
