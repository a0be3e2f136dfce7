package inbox

import "time"

// SetClaimFloor sets the margin of a worker's claim bound and how often its
// claims scan from the start, before Run.
func SetClaimFloor(w *Worker, margin, fullEvery time.Duration) {
	w.floor.mu.Lock()
	defer w.floor.mu.Unlock()
	w.floor.margin, w.floor.fullEvery, w.floor.maxEvery = margin, fullEvery, fullEvery
}
