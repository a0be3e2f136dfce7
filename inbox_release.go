package pgrelay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/pgrelay/pgrelay/internal/db"
)

// Release makes the events deferred on each of waitingFor due at once, in one
// statement; call it from a handler, with its transaction, when it creates what
// they wait for. It takes no lock beyond the rows it writes, so it never waits
// for another batch's deferral.
func Release(ctx context.Context, q DBTX, waitingFor ...string) error {
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

// NotifyInbox wakes the inbox workers of every process when q's transaction
// commits. Receive does not wake anyone: a process running its workers itself
// calls InboxWorker.Wake after its commit; one storing events for workers
// elsewhere calls NotifyInbox in the transaction. Otherwise the workers find
// the events at their next poll (InboxConfig.PollInterval).
func NotifyInbox(ctx context.Context, q DBTX) error {
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
