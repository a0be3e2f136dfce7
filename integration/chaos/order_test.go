package chaos

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/db"
)

// TestCheckApplyOrder: the checker's per-key apply order check finds a
// sequence applied while an earlier one was not, one applied before an
// earlier one, and a missing one; an ordered key passes.
func TestCheckApplyOrder(t *testing.T) {
	t.Parallel()
	at := func(s int) *time.Time { v := time.Unix(int64(s), 0); return &v }
	row := func(key string, seq int64, status string, fin *time.Time) db.ChaosInboxOrderRow {
		return db.ChaosInboxOrderRow{Handler: "default", Key: key, KeySeq: seq, EventID: fmt.Sprintf("%s-%d", key, seq),
			Status: status, FinishedAt: fin}
	}
	rows := []db.ChaosInboxOrderRow{
		row("good", 1, "processed", at(1)), row("good", 2, "processed", at(1)), row("good", 3, "processed", at(2)),
		row("skipped-over", 1, "pending", nil), row("skipped-over", 2, "processed", at(3)),
		row("backwards", 1, "processed", at(5)), row("backwards", 2, "processed", at(4)),
		row("hole", 1, "processed", at(1)), row("hole", 3, "processed", at(2)),
	}
	var got []string
	n := checkApplyOrder(rows, func(format string, args ...any) { got = append(got, fmt.Sprintf(format, args...)) })
	require := func(cond bool, msg string) {
		t.Helper()
		if !cond {
			t.Fatalf("%s; violations: %q", msg, got)
		}
	}
	require(n == 4, "four keys checked")
	require(len(got) == 3, "three violations")
	joined := strings.Join(got, "\n")
	for _, key := range []string{"skipped-over", "backwards", "hole"} {
		require(strings.Contains(joined, "ordered key "+key+":"), key+" not reported")
	}
	require(!strings.Contains(joined, "key good"), "an ordered key reported")
}
