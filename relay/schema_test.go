package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/logtest"
	"github.com/pgrelay/pgrelay/internal/testdb"
	"github.com/pgrelay/pgrelay/migrations"
)

// migratedTo returns the bundle of a new database of b's server with the
// migrations applied up to version (goose up-to), sharing b's stream.
func (b *bundle) migratedTo(t *testing.T, version int64) *bundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u := testdb.EmptyURL(t)
	pool, err := pgxpool.New(ctx, u)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()
	p, err := migrations.NewProvider(sqlDB)
	require.NoError(t, err)
	_, err = p.UpTo(ctx, version)
	require.NoError(t, err)
	c := *b
	c.pool, c.dbURL = pool, u
	return &c
}

// embeddedVersions returns the embedded migration versions, in order.
func embeddedVersions(t *testing.T, pool *pgxpool.Pool) []int64 {
	t.Helper()
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()
	p, err := migrations.NewProvider(sqlDB)
	require.NoError(t, err)
	var vs []int64
	for _, s := range p.ListSources() {
		vs = append(vs, s.Version)
	}
	return vs
}

// TestServesADatabaseBehindWithinRange: a database migrated exactly to the
// table relay's minimum version is served (an event written to it is
// published) and said to be behind (a warning naming it, the gauges, GET
// /v1/databases); one a version below the minimum is refused at start and
// on SetDatabases, named, the others served on; migrating the database
// behind to the latest clears it at the next re-read, without a restart.
func TestServesADatabaseBehindWithinRange(t *testing.T) {
	b := setup(t)
	versions := embeddedVersions(t, b.pool)
	latest := versions[len(versions)-1]
	i := slices.Index(versions, minSchemaTable)
	require.Positive(t, i, "minSchemaTable %d is an embedded version above the first", minSchemaTable)
	below := versions[i-1]
	pending := versions[i+1:]
	behind := b.migratedTo(t, minSchemaTable)
	tooOld := b.migratedTo(t, below)
	dbs := []Database{{Name: "db0", Pool: b.pool}, {Name: "behind", Pool: behind.pool}, {Name: "old", Pool: tooOld.pool}}

	// At start: the database below the minimum stops the relay, named.
	cfg := b.testConfig(t, b.publisher(t), nil)
	cfg.Pool, cfg.Databases = nil, dbs
	r, err := New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = r.Run(ctx)
	require.ErrorContains(t, err, "relay.Config.Databases: database old: ")
	require.ErrorContains(t, err, fmt.Sprintf("at version %d, this build needs version %d at least (latest %d; pending: ", below, minSchemaTable, latest))
	require.ErrorContains(t, err, strconv.FormatInt(minSchemaTable, 10)+", ")
	t.Log(err)

	// Without it: served, and said to be behind.
	log, logs := logtest.Observe(slog.LevelInfo)
	cfg = b.testConfig(t, b.publisher(t), nil)
	cfg.Pool, cfg.Databases, cfg.log = nil, dbs[:2], log
	cfg.MetricsAddr, cfg.AdminAddr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.hooks.schemaInterval = 200 * time.Millisecond
	r, _ = runRelay(t, cfg)
	behind.enqueue(t, msgs(20, "", "behind")...)
	behind.waitCount(t, "published", 20, 30*time.Second)
	b.enqueue(t, msgs(20, "", "latest")...)
	b.waitCount(t, "published", 20, 30*time.Second)

	warned := logs.FilterMessageSnippet("database schema behind the latest migration").All()
	require.Len(t, warned, 1, "one warning, for the database behind")
	require.Equal(t, slog.LevelWarn, warned[0].Level)
	m := warned[0].ContextMap()
	require.Equal(t, "behind", m["database"])
	require.Equal(t, minSchemaTable, m["version"])
	require.Equal(t, latest, m["latest"])
	require.Equal(t, pending, m["pending"])

	metric := func(name, database string) string {
		t.Helper()
		resp, err := http.Get("http://" + r.MetricsAddr().String() + "/metrics")
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		v := regexp.MustCompile(fmt.Sprintf(`(?m)^%s\{database=%q\} (\S+)$`, name, database)).FindSubmatch(body)
		require.NotNil(t, v, "%s{database=%q} in\n%s", name, database, body)
		return string(v[1])
	}
	require.Equal(t, strconv.FormatInt(minSchemaTable, 10), metric("relay_schema_version", "behind"))
	require.Equal(t, strconv.Itoa(len(pending)), metric("relay_schema_pending_migrations", "behind"))
	require.Equal(t, strconv.FormatInt(latest, 10), metric("relay_schema_version", "db0"))
	require.Equal(t, "0", metric("relay_schema_pending_migrations", "db0"))

	schemas := func() map[string]migrations.Status {
		t.Helper()
		resp, err := http.Get("http://" + r.AdminAddr().String() + "/v1/databases")
		require.NoError(t, err)
		defer resp.Body.Close()
		var list []struct {
			Name   string             `json:"name"`
			Error  string             `json:"error"`
			Schema *migrations.Status `json:"schema"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&list))
		out := map[string]migrations.Status{}
		for _, d := range list {
			require.Empty(t, d.Error, d.Name)
			require.NotNil(t, d.Schema, d.Name)
			out[d.Name] = *d.Schema
		}
		return out
	}
	require.Equal(t, map[string]migrations.Status{
		"db0":    {Current: latest, Latest: latest, Pending: []int64{}},
		"behind": {Current: minSchemaTable, Latest: latest, Pending: pending},
	}, schemas())

	// SIGHUP's SetDatabases: the database below the minimum is skipped,
	// named and logged; the others are served on.
	err = r.SetDatabases(ctx, dbs)
	require.ErrorContains(t, err, "database old: ")
	require.ErrorContains(t, err, fmt.Sprintf("needs version %d at least", minSchemaTable))
	require.Equal(t, []string{"db0", "behind"}, r.Databases())
	require.Equal(t, 1, logs.FilterMessage("database skipped").Len())
	behind.enqueue(t, msgs(5, "", "after-reload")...)
	behind.waitCount(t, "published", 25, 30*time.Second)

	// Migrated to the latest while served: no longer behind at the next
	// re-read.
	sqlDB := stdlib.OpenDBFromPool(behind.pool)
	defer sqlDB.Close()
	require.NoError(t, migrations.Up(ctx, sqlDB))
	require.Eventually(t, func() bool { return metric("relay_schema_pending_migrations", "behind") == "0" },
		20*time.Second, 50*time.Millisecond)
	require.Equal(t, strconv.FormatInt(latest, 10), metric("relay_schema_version", "behind"))
	require.Equal(t, migrations.Status{Current: latest, Latest: latest, Pending: []int64{}}, schemas()["behind"])
	up := logs.FilterMessage("database schema up to date").All()
	require.Len(t, up, 1)
	require.Equal(t, "behind", up[0].ContextMap()["database"])
}

// TestWALCaptureNeedsItsMinimum: the WAL capture needs a later schema than
// the table capture (its slot history): a database at the table relay's
// minimum is refused by a WAL-capture relay, named, before any slot is made.
func TestWALCaptureNeedsItsMinimum(t *testing.T) {
	b := setup(t)
	behind := b.migratedTo(t, minSchemaTable)
	cfg := behind.testConfig(t, b.publisher(t), nil)
	cfg.Capture = CaptureWAL
	r, err := New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = r.Run(ctx)
	require.ErrorContains(t, err, fmt.Sprintf("at version %d, this build needs version %d", minSchemaTable, minSchemaWAL))
	var slots int
	require.NoError(t, behind.pool.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE database = current_database()`).Scan(&slots))
	require.Zero(t, slots)
}
