package pgrelay

import (
	"context"
	"time"
)

// SetClaimFloor sets the margin of a worker's claim bound and how often its
// claims scan from the start, before Run.
func SetClaimFloor(w *InboxWorker, margin, fullEvery time.Duration) {
	w.floor.mu.Lock()
	defer w.floor.mu.Unlock()
	w.floor.margin, w.floor.fullEvery, w.floor.maxEvery = margin, fullEvery, fullEvery
}

// RunOnce claims one batch and processes it, as a worker goroutine does,
// without Run (no takeover of lost events).
func RunOnce(ctx context.Context, w *InboxWorker) error {
	_, _, err := w.runOnce(ctx, false)
	return err
}

// NopObserver is an InboxObserver that ignores everything, for tests'
// observers to embed.
type NopObserver = nopObserver

// StoredRows returns the rows a Receive stored, by handler and dedup key.
func StoredRows(r ReceiveResult) []storedRow { return r.stored }
