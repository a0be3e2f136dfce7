package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestAdminServesEveryDatabase: the admin API and the console of a relay
// serving three databases answer for the database a request names (none:
// the first), refuse an unknown one naming those served, list them, and
// follow SetDatabases.
func TestAdminServesEveryDatabase(t *testing.T) {
	b := setup(t)
	dbs, bs := b.more(t, 2)
	cfg := b.testConfig(t, b.publisher(t), nil)
	cfg.Pool, cfg.Databases, cfg.AdminAddr = nil, dbs, "127.0.0.1:0"
	r, _ := runRelay(t, cfg)
	for i, d := range bs { // db0: 1 event, db1: 2, db2: 3
		d.enqueue(t, msgs(i+1, "", fmt.Sprintf("ev-db%d", i))...)
		d.waitCount(t, "published", i+1, 20*time.Second)
	}
	// One dead event in db1 only.
	_, err := bs[1].pool.Exec(context.Background(), `UPDATE pgrelay.outbox SET status = 'dead', dead_at = now(), last_error = 'poison' WHERE event_id = 'ev-db1-0'`)
	require.NoError(t, err)

	fetch := func(path string) (int, string, error) {
		resp, err := http.Get("http://" + r.AdminAddr().String() + path)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), err
	}
	get := func(path string) (int, string) {
		t.Helper()
		code, body, err := fetch(path)
		require.NoError(t, err)
		return code, body
	}
	// count is the database's outbox rows (published or dead) as /v1/stats
	// reports them, or -1.
	count := func(query string) int64 {
		code, body, err := fetch("/v1/stats" + query)
		var st struct {
			Outbox struct {
				ByStatus map[string]int64 `json:"by_status"`
			} `json:"outbox"`
		}
		if err != nil || code != http.StatusOK || json.Unmarshal([]byte(body), &st) != nil {
			return -1
		}
		return st.Outbox.ByStatus["published"] + st.Outbox.ByStatus["dead"]
	}
	published := func(query string) int64 {
		t.Helper()
		n := count(query)
		require.NotEqual(t, int64(-1), n, "GET /v1/stats%s", query)
		return n
	}
	require.EqualValues(t, 1, published(""), "no database named: the first")
	for i := range bs {
		require.EqualValues(t, i+1, published("?database="+dbs[i].Name), "database db%d", i)
	}
	// Requests to several databases at once each get their own.
	var wg sync.WaitGroup
	counts := make([][]int64, len(bs))
	for i := range bs {
		wg.Go(func() {
			for range 20 {
				counts[i] = append(counts[i], count("?database="+dbs[i].Name))
			}
		})
	}
	wg.Wait()
	for i := range bs {
		for _, n := range counts[i] {
			require.EqualValues(t, i+1, n, "database db%d", i)
		}
	}
	code, body := get("/v1/outbox/dead?database=db1")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "ev-db1-0")
	code, body = get("/v1/outbox/dead?database=db2")
	require.Equal(t, http.StatusOK, code, body)
	require.NotContains(t, body, "ev-db1-0")

	code, body = get("/v1/stats?database=nope")
	require.Equal(t, http.StatusNotFound, code, body)
	require.Contains(t, body, `database \"nope\" is not served (databases: db0, db1, db2)`)

	listed := func() []string {
		t.Helper()
		code, body := get("/v1/databases")
		require.Equal(t, http.StatusOK, code, body)
		var list []struct {
			Name    string `json:"name"`
			Default bool   `json:"default"`
			Error   string `json:"error"`
		}
		require.NoError(t, json.Unmarshal([]byte(body), &list))
		var names []string
		for i, d := range list {
			require.Equal(t, i == 0, d.Default, body)
			require.Empty(t, d.Error, body)
			names = append(names, d.Name)
		}
		return names
	}
	require.Equal(t, []string{"db0", "db1", "db2"}, listed())

	// The console: a selector of the three, the page's database carried in
	// its links and forms, each database's own dead letters.
	code, body = get("/console/dead?source=outbox&database=db1")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `id="databases"`)
	for _, n := range []string{"db0", "db1", "db2"} {
		require.Contains(t, body, `href="/console/dead?database=`+n+`"`)
	}
	require.Contains(t, body, "ev-db1-0")
	require.Contains(t, body, `href="/console/relay?database=db1"`)
	require.Contains(t, body, `href="/console/dead?source=inbox&amp;database=db1"`)
	require.Contains(t, body, `<input type="hidden" name="database" value="db1">`)
	require.NotContains(t, body, `href="/console/audit"`, "every link names the database")
	code, body = get("/console/dead/outbox/ev-db1-0?database=db1")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `action="/console/act?database=db1"`, "its actions too")
	code, body = get("/console/dead?source=outbox&database=db2")
	require.Equal(t, http.StatusOK, code, body)
	require.NotContains(t, body, "ev-db1-0")
	code, body = get("/console/relay?database=nope")
	require.Equal(t, http.StatusNotFound, code, body)
	require.Contains(t, body, "databases: db0, db1, db2")

	// SetDatabases: db1 removed disappears, then added back appears.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, r.SetDatabases(ctx, []Database{dbs[0], dbs[2]}))
	require.Equal(t, []string{"db0", "db2"}, listed())
	code, body = get("/v1/stats?database=db1")
	require.Equal(t, http.StatusNotFound, code, body)
	require.Contains(t, body, "(databases: db0, db2)")
	require.NoError(t, r.SetDatabases(ctx, dbs))
	require.Equal(t, []string{"db0", "db2", "db1"}, listed())
	require.EqualValues(t, 2, published("?database=db1"))
}
