package inbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/db"
	"github.com/pgrelay/pgrelay/internal/maintenance"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// explainTx runs a generated statement under EXPLAIN (ANALYZE, BUFFERS) and
// keeps the plan instead of the rows, so a test looks at the very SQL the
// worker runs. EXPLAIN ANALYZE executes it: use it in a transaction that is
// rolled back.
type explainTx struct {
	db.DBTX
	plan []byte
}

var errExplained = errors.New("explained")

func (e *explainTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := e.DBTX.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+sql, args...).Scan(&e.plan); err != nil {
		return nil, err
	}
	return nil, errExplained
}

func (e *explainTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := e.DBTX.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+sql, args...).Scan(&e.plan); err != nil {
		return pgconn.CommandTag{}, err
	}
	return pgconn.CommandTag{}, errExplained
}

type planNode struct {
	NodeType   string     `json:"Node Type"`
	IndexName  string     `json:"Index Name"`
	ActualRows int        `json:"Actual Rows"`
	SharedHit  int        `json:"Shared Hit Blocks"`
	SharedRead int        `json:"Shared Read Blocks"`
	Plans      []planNode `json:"Plans"`
}

// scanned returns the largest number of rows any scan node of the plan
// produced.
func (n planNode) scanned() int {
	m := 0
	switch n.NodeType {
	case "Seq Scan", "Index Scan", "Index Only Scan", "Bitmap Heap Scan", "Bitmap Index Scan":
		m = n.ActualRows
	}
	for _, c := range n.Plans {
		m = max(m, c.scanned())
	}
	return m
}

// TestBatchMarksLookUpTheirRowsOnceAnalyzed: the statements that close a
// claimed batch (the bulk processed mark, the unclaim, the ordered duplicate
// absorb) look their rows up by primary key once the inbox has statistics,
// which the worker keeps (maintenance.Statistics). Without any (a new inbox,
// autovacuum off or behind) the planner's defaults say few rows belong to
// the handler, and the mark read every row of the handler per batch: 20,000
// rows and 18 ms for a mark of 100, 37 ms a mark in the end to end
// benchmark, growing with the table. The test shows both.
func TestBatchMarksLookUpTheirRowsOnceAnalyzed(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const rows, batch = 20000, 100
	for _, q := range []string{
		`ALTER TABLE inbox SET (autovacuum_enabled = false)`,
		fmt.Sprintf(`INSERT INTO inbox (event_id, topic, status, lock_version) SELECT 'e-' || g, 'orders', 'processing', 1 FROM generate_series(1, %d) AS g`, rows),
	} {
		_, err := pool.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	keys := make([]string, batch)
	versions := make([]int64, batch)
	for i := range keys {
		keys[i] = fmt.Sprintf("e-%d", 5000+i*37)
		versions[i] = 1
	}
	statements := map[string]func(db.DBTX) error{
		"MarkInboxBatchProcessed": func(tx db.DBTX) error {
			_, err := db.New().MarkInboxBatchProcessed(ctx, tx, db.MarkInboxBatchProcessedParams{Handler: "default", DedupKeys: keys, LockVersions: versions})
			return err
		},
		"UnclaimInbox": func(tx db.DBTX) error {
			_, err := db.New().UnclaimInbox(ctx, tx, db.UnclaimInboxParams{Handler: "default", DedupKeys: keys, LockVersions: versions})
			return err
		},
		"AbsorbInboxSeqDuplicates": func(tx db.DBTX) error {
			_, err := db.New().AbsorbInboxSeqDuplicates(ctx, tx, db.AbsorbInboxSeqDuplicatesParams{Handler: "default", DedupKeys: keys, LockVersions: versions, LastApplied: versions})
			return err
		},
	}
	largestScan := func(name string) int {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		ex := &explainTx{DBTX: tx}
		require.ErrorIs(t, statements[name](ex), errExplained)
		var plans []struct {
			Plan planNode `json:"Plan"`
		}
		require.NoError(t, json.Unmarshal(ex.plan, &plans), string(ex.plan))
		return plans[0].Plan.scanned()
	}
	withoutStatistics := map[string]int{}
	for name := range statements {
		withoutStatistics[name] = largestScan(name)
	}
	// What the worker does when the table changed this much: the inserting
	// backend reports its changes within a second of going idle.
	stats := maintenance.Statistics{Pool: pool, Table: "inbox"}
	require.Eventually(t, func() bool {
		did, err := stats.RunOnce(ctx)
		require.NoError(t, err)
		return did
	}, 20*time.Second, 100*time.Millisecond, "the inbox was never found stale")
	for name := range statements {
		got := largestScan(name)
		t.Logf("%s of %d among %d rows: largest scan %d rows without statistics, %d analyzed", name, batch, rows, withoutStatistics[name], got)
		require.LessOrEqual(t, got, 2*batch, "%s must look up its %d rows, not scan the handler's", name, batch)
	}
}
