package inbox

import (
	"context"
	"time"
)

// SetClaimFloor sets the margin of a worker's claim bound and how often its
// claims scan from the start, before Run.
func SetClaimFloor(w *Worker, margin, fullEvery time.Duration) {
	w.floor.mu.Lock()
	defer w.floor.mu.Unlock()
	w.floor.margin, w.floor.fullEvery, w.floor.maxEvery = margin, fullEvery, fullEvery
}

// RunOnce claims one batch and processes it, as a worker goroutine does,
// without Run (no takeover of lost events).
func RunOnce(ctx context.Context, w *Worker) error {
	_, _, err := w.runOnce(ctx, false)
	return err
}
