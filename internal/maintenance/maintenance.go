// Package maintenance holds what the upkeep of pgrelay's tables shares. Each
// table's upkeep lives beside the service that owns the table and starts
// with it: the inbox worker cleans the inbox and its side tables
// (inbox.Cleaner), the relay deletes published outbox rows
// (the relay's outbox cleaner). Both delete in bounded batches (Batches) and run
// on a jittered interval (wait.Every).
package maintenance

import (
	"context"
	"time"

	"github.com/pgrelay/pgrelay/internal/wait"
)

// Batches bounds a delete: each batch is its own short statement, so that
// upkeep never holds many row locks or a long transaction.
type Batches struct {
	// Size is the most rows one batch deletes. Required (positive).
	Size int
	// Pause is the wait between two batches, which leaves room to the
	// service's own writes. 0: none.
	Pause time.Duration
	// Timeout bounds each batch. Required (positive).
	Timeout time.Duration
}

// Delete runs batch (given the batch size) one call after another, each
// with its own timeout, until a call deletes fewer than Size rows, ctx ends
// or a call fails, and returns how many rows were deleted.
func (b Batches) Delete(ctx context.Context, batch func(ctx context.Context, size int32) (int64, error)) (int64, error) {
	var total int64
	for {
		qctx, cancel := context.WithTimeout(ctx, b.Timeout)
		n, err := batch(qctx, int32(b.Size))
		cancel()
		if err != nil {
			return total, err
		}
		total += n
		if n < int64(b.Size) {
			return total, nil
		}
		if ctx.Err() != nil || b.Pause > 0 && !wait.Sleep(ctx, b.Pause) {
			return total, ctx.Err()
		}
	}
}
