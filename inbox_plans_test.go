package pgrelay_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/db"
	"github.com/pgrelay/pgrelay/internal/maintenance"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

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
		`ALTER TABLE pgrelay.inbox SET (autovacuum_enabled = false)`,
		fmt.Sprintf(`INSERT INTO pgrelay.inbox (event_id, topic, status, lock_version) SELECT 'e-' || g, 'orders', 'processing', 1 FROM generate_series(1, %d) AS g`, rows),
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
		"MarkInboxBatchProcessedAll": func(tx db.DBTX) error {
			return db.New().MarkInboxBatchProcessedAll(ctx, tx, db.MarkInboxBatchProcessedAllParams{Handler: "default", DedupKeys: keys, LockVersions: versions})
		},
		"InboxStillClaimed": func(tx db.DBTX) error {
			_, err := db.New().InboxStillClaimed(ctx, tx, db.InboxStillClaimedParams{Handler: "default", DedupKeys: keys, LockVersions: versions})
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
		ex := &testdb.Explain{DBTX: tx}
		require.ErrorIs(t, statements[name](ex), testdb.ErrExplained)
		return ex.Root(t).LargestScan()
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
