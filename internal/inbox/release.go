package inbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/pgrelay/pgrelay/internal/db"
)

// Release makes the events deferred on each of waitingFor (see Defer) due at
// once, in one statement. A handler calls it inside its transaction when it
// creates what others wait for (an OrderCreated handler releases
// "order:"+id); the events run after that transaction commits. Release also
// records the release, so that an event deferring on the same dependency in a
// transaction committing concurrently is not left waiting for its fallback.
// It takes no lock beyond the rows it writes: the worker checks both sides
// again after each commit (see WakeReleasedInbox in queries/inbox.sql).
func Release(ctx context.Context, q db.DBTX, waitingFor ...string) error {
	if len(waitingFor) == 0 {
		return nil
	}
	keys := slices.Clone(waitingFor)
	for _, k := range keys {
		if k == "" {
			return errors.New("inbox: release: empty dependency name")
		}
	}
	// One order for every transaction's row locks on the release records, and
	// no key twice (ON CONFLICT DO UPDATE cannot touch a row twice).
	slices.Sort(keys)
	keys = slices.Compact(keys)
	n, err := db.New().ReleaseInbox(ctx, q, keys)
	if err != nil {
		return fmt.Errorf("inbox: release %q: %w", keys, err)
	}
	if rs := releasesFrom(ctx); rs != nil {
		// Inside a worker's handler: the worker checks these keys again after
		// its commit and wakes its own goroutines.
		rs.add(keys)
		return nil
	}
	if n > 0 {
		if err := db.New().NotifyInbox(ctx, q); err != nil {
			return fmt.Errorf("inbox: release %q: notify: %w", keys, err)
		}
	}
	return nil
}

// Notify wakes, when q's transaction commits, the workers of every process
// listening on the inbox (LISTEN/NOTIFY). Receive does not notify: a consumer
// whose workers run in the same process calls Worker.Wake after its commit
// instead, and a process storing events for workers elsewhere calls Notify in
// its transaction. Without either, workers find new events at their next poll.
func Notify(ctx context.Context, q db.DBTX) error {
	if err := db.New().NotifyInbox(ctx, q); err != nil {
		return fmt.Errorf("inbox: notify: %w", err)
	}
	return nil
}

// releaseSet collects the dependencies released by one batch's handlers.
type releaseSet struct {
	mu   sync.Mutex
	keys []string
}

func (r *releaseSet) add(keys []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.keys = append(r.keys, keys...)
}

func (r *releaseSet) taken() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := r.keys
	r.keys = nil
	return k
}

type releaseSetKey struct{}

func withReleaseSet(ctx context.Context, rs *releaseSet) context.Context {
	return context.WithValue(ctx, releaseSetKey{}, rs)
}

func releasesFrom(ctx context.Context) *releaseSet {
	rs, _ := ctx.Value(releaseSetKey{}).(*releaseSet)
	return rs
}
