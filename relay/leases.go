package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/pgrelay/pgrelay/internal/db"
)

// tick registers this relay, renews its leases, and gives up or acquires
// partitions so that it owns its fair share.
func (r *engine) tick(ctx context.Context) error {
	if h := r.cfg.hooks.beforeHeartbeat; h != nil {
		h()
	}
	// With a lock session, leases are renewed and taken under it, and its
	// workers work them; while it is down (reconnecting), nothing is.
	var s *lockSession
	if r.locking() {
		if s = r.session(); s == nil {
			return nil
		}
	}
	qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	renewed, deadline, err := r.renew(qctx, s)
	if err != nil {
		return err
	}
	owned := r.keepRenewed(ctx, renewed, deadline, s)
	share, err := r.fairShare(qctx)
	if err != nil {
		return err
	}
	if err := r.rebalance(ctx, qctx, owned, share, s); err != nil {
		return err
	}
	r.reportHeld()
	if rand.IntN(20) == 0 {
		if err := r.q.DeleteStaleNodes(qctx, r.cfg.Pool, 10*r.cfg.Lease.Seconds()); err != nil {
			return fmt.Errorf("delete stale relays: %w", err)
		}
	}
	return nil
}

// renew registers this relay (heartbeat) and renews the leases it holds under
// s (nil: lease only); it returns them with the deadline they last until on
// this process's clock.
func (r *engine) renew(qctx context.Context, s *lockSession) ([]db.RenewLeasesRow, time.Duration, error) {
	if err := r.q.HeartbeatNode(qctx, r.cfg.Pool, db.HeartbeatNodeParams{NodeID: r.cfg.NodeID, LockKey: s.lockKey()}); err != nil {
		return nil, 0, fmt.Errorf("heartbeat: %w", err)
	}
	// A lease renewed or taken by a statement sent now lasts at least until
	// now + Lease on this process's clock: the database's lease_until
	// is computed later, from the same duration.
	deadline := r.leaseDeadline()
	renewed, err := r.q.RenewLeases(qctx, r.cfg.Pool, db.RenewLeasesParams{LeaseSeconds: r.cfg.Lease.Seconds(), Owner: r.cfg.NodeID, LockKey: s.lockKey()})
	if err != nil {
		return nil, 0, fmt.Errorf("renew leases: %w", err)
	}
	return renewed, deadline, nil
}

// keepRenewed stops the workers whose lease was not renewed at their epoch
// (lost), extends the others' to deadline, starts a worker for a lease held
// with none (under s), and returns the partitions this relay now works.
func (r *engine) keepRenewed(ctx context.Context, renewed []db.RenewLeasesRow, deadline time.Duration, s *lockSession) []int32 {
	held := make(map[int32]int64, len(renewed))
	for _, l := range renewed {
		held[l.Partition] = l.Epoch
	}

	r.mu.Lock()
	var owned []int32
	for p, w := range r.workers {
		if w.stopping() {
			continue
		}
		if e, ok := held[p]; !ok || e != w.epoch {
			r.log.Warn("partition lease lost", slog.Any("partition", p), slog.Int64("epoch", w.epoch))
			r.cfg.obs.LeaseLost(int(p))
			w.stop(false)
			continue
		}
		w.leaseUntil.Store(int64(deadline))
		owned = append(owned, p)
	}
	// A lease held with no worker (its release failed) is worked again
	// rather than renewed forever with nobody publishing.
	var orphans []db.RenewLeasesRow
	for _, l := range renewed {
		if r.workers[l.Partition] == nil {
			orphans = append(orphans, l)
			owned = append(owned, l.Partition)
		}
	}
	r.mu.Unlock()
	for _, l := range orphans {
		r.startWorker(ctx, l.Partition, l.Epoch, deadline, s)
	}
	return owned
}

// fairShare returns how many partitions each live relay should hold.
func (r *engine) fairShare(qctx context.Context) (int, error) {
	live, err := r.q.CountLiveNodes(qctx, r.cfg.Pool, r.cfg.Lease.Seconds())
	if err != nil {
		return 0, fmt.Errorf("count relays: %w", err)
	}
	total, err := r.q.CountPartitions(qctx, r.cfg.Pool)
	if err != nil {
		return 0, fmt.Errorf("count partitions: %w", err)
	}
	if live < 1 {
		live = 1
	}
	r.cfg.gate.fleet(r.cfg.database, int(live))
	share := (int(total) + int(live) - 1) / int(live)
	r.checkPoolSize(share)
	return share, nil
}

// rebalance gives up the partitions owned beyond share, or acquires free or
// expired ones, or those of an ended lock session, up to it, under s.
func (r *engine) rebalance(ctx, qctx context.Context, owned []int32, share int, s *lockSession) error {
	switch {
	case len(owned) > share:
		// Give up the highest partitions beyond the fair share; each worker
		// finishes its batch, then releases its lease.
		sort.Slice(owned, func(i, j int) bool { return owned[i] > owned[j] })
		r.mu.Lock()
		for _, p := range owned[:len(owned)-share] {
			r.log.Info("releasing partition to rebalance", slog.Any("partition", p), slog.Int("share", share))
			r.workers[p].stop(true)
		}
		r.mu.Unlock()
	case len(owned) < share:
		owners, keys := r.takeable()
		deadline := r.leaseDeadline()
		got, err := r.q.AcquirePartitions(qctx, r.cfg.Pool, db.AcquirePartitionsParams{
			Owner: r.cfg.NodeID, LockKey: s.lockKey(), LeaseSeconds: r.cfg.Lease.Seconds(), MaxCount: int32(share - len(owned)),
			EndedOwners: owners, EndedKeys: keys,
		})
		if err != nil {
			return fmt.Errorf("acquire partitions: %w", err)
		}
		for _, a := range got {
			takenOver := a.PreviousOwner != nil
			r.log.Info("partition acquired", slog.Any("partition", a.Partition), slog.Int64("epoch", a.Epoch), slog.Bool("taken_over", takenOver))
			r.cfg.obs.LeaseAcquired(int(a.Partition), a.Epoch, takenOver)
			r.startWorker(ctx, a.Partition, a.Epoch, deadline, s)
		}
	}
	return nil
}

// reportHeld tells the observer how many partitions are being worked.
func (r *engine) reportHeld() {
	r.mu.Lock()
	working := 0
	for _, w := range r.workers {
		if !w.stopping() {
			working++
		}
	}
	r.mu.Unlock()
	r.cfg.obs.PartitionsHeld(working)
}

// checkPoolSize warns, once per share, when the pool is too small for the
// partitions the relay is to own.
func (r *engine) checkPoolSize(share int) {
	have, want := int(r.cfg.Pool.Config().MaxConns), PoolConns(share)
	if have >= want || share == r.poolWarnedShare {
		return
	}
	r.poolWarnedShare = share
	r.log.Warn("the database pool is smaller than the relay's partitions use at once; their reads and marks queue for connections (raise pool_max_conns)",
		slog.Int("pool_max_conns", have), slog.Int("partitions", share), slog.Int("wanted_conns", want))
}

// errFenced reports a mark refused because the partition has a new owner.
var errFenced = errors.New("fenced: the partition was taken over")

// errLeaseExpired reports a batch not published because the lease could have
// expired (the relay was paused, or its heartbeats failed): another relay may
// own the partition and have published the rows already.
var errLeaseExpired = errors.New("lease expired before publishing: the batch was not published")

// errSessionLapsed reports a batch not published because the relay's lock
// session was not confirmed within lockValidFor, or has ended: another relay
// may take the partition.
var errSessionLapsed = errors.New("lock session not confirmed: the batch was not published")

// leaseDeadline is the end of a lease renewed or taken by a statement sent
// now, on the monotonic clock.
func (r *engine) leaseDeadline() time.Duration {
	return time.Since(r.clock) + r.cfg.Lease
}

// leaseEnd returns when w's lease ends at the latest, as a time carrying a
// monotonic reading.
func (r *engine) leaseEnd(w *worker) time.Time {
	return r.clock.Add(time.Duration(w.leaseUntil.Load()))
}
