package inbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/pgrelay/pgrelay/internal/db"
)

// Release makes the events deferred on waitingFor (see Defer) due at once. A
// handler calls it inside its transaction when it creates what others wait
// for (an OrderCreated handler releases "order:"+id); the events run after
// that transaction commits. Release also records the release, so an event
// whose handler is deferring on the same dependency concurrently is not left
// waiting for its fallback: Release and the deferral serialize on a
// transaction-scoped advisory lock on the dependency.
func Release(ctx context.Context, q db.DBTX, waitingFor string) error {
	if waitingFor == "" {
		return errors.New("inbox: release: empty dependency name")
	}
	queries := db.New()
	if err := queries.LockInboxDependency(ctx, q, waitingFor); err != nil {
		return fmt.Errorf("inbox: release %q: lock: %w", waitingFor, err)
	}
	if err := queries.RecordInboxRelease(ctx, q, waitingFor); err != nil {
		return fmt.Errorf("inbox: release %q: record: %w", waitingFor, err)
	}
	n, err := queries.ReleaseInbox(ctx, q, waitingFor)
	if err != nil {
		return fmt.Errorf("inbox: release %q: %w", waitingFor, err)
	}
	if n > 0 {
		if err := queries.NotifyInbox(ctx, q); err != nil {
			return fmt.Errorf("inbox: release %q: notify: %w", waitingFor, err)
		}
	}
	return nil
}
