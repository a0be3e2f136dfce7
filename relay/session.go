package relay

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgrelay/pgrelay/internal/db"
	"github.com/pgrelay/pgrelay/internal/wait"
)

// The lock session (docs/relay.md, "Partitions, leases and fencing"). A relay
// with a connection of its own to PostgreSQL (not NoListen) holds, on a
// dedicated connection, a session-level advisory lock on a random key, and
// takes and renews its leases under that key. PostgreSQL drops the lock the
// moment the session ends (the process died, the connection was closed), so
// the other relays can tell that the owner is gone without waiting for its
// leases:
//
//   - Every lockCheckEvery the relay runs one statement on that connection
//     (EndedLockSessions): its answer confirms that the session, and so the
//     lock, was alive when it was sent, and it lists the other relays whose
//     key no session holds any more.
//   - A relay starts publishing a batch only within lockValidFor of its last
//     confirmation's sending, and not at all once its session failed: a
//     relay cut off from PostgreSQL starts no batch after lockValidFor, even
//     if it never learns that the server ended its session. A batch already
//     handed to the broker goes on (see publishBatch): what it still sends
//     is a copy of what the new owner publishes, in the same order.
//   - A relay takes the partitions held under an ended session only
//     lockValidFor after it first saw it ended: by then the owner, if it is
//     alive at all, has stopped publishing them. Fencing (the epoch) still
//     guards every mark.
const (
	lockCheckEvery = 250 * time.Millisecond
	lockValidFor   = time.Second
	lockRedialMax  = 2 * time.Second
)

// lockSession is one session of the lock connection. Once ended it is never
// valid again: the workers started under it stop, and the leases taken under
// it are released by the next session.
type lockSession struct {
	key int64

	mu    sync.Mutex
	until time.Time // a batch may start publishing before it
	ended bool      // the connection failed or was closed
	// changed is closed, and replaced, at each confirmation and at the end.
	changed chan struct{}
}

func newLockSession(key int64) *lockSession {
	return &lockSession{key: key, changed: make(chan struct{})}
}

// confirm records that the session was alive when a statement sent at sent
// was answered.
func (s *lockSession) confirm(sent time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ended && sent.Add(lockValidFor).After(s.until) {
		s.until = sent.Add(lockValidFor)
	}
	close(s.changed)
	s.changed = make(chan struct{})
}

// end marks the session failed: no batch starts publishing under it any more.
func (s *lockSession) end() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ended {
		close(s.changed)
	}
	s.ended, s.until = true, time.Time{}
}

// await waits, for at most d or until ctx ends, for s to be valid, and
// reports whether it is. A check slower than lockValidFor (PostgreSQL busy)
// leaves the session unconfirmed until its answer arrives: a batch then
// waits for that answer instead of failing and backing off.
func (s *lockSession) await(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		s.mu.Lock()
		valid, ended, changed := !s.ended && time.Now().Before(s.until), s.ended, s.changed
		s.mu.Unlock()
		if valid || ended {
			return valid
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return false
		case <-t.C:
			return s.valid()
		}
	}
}

// valid reports whether a batch may start publishing under s now.
func (s *lockSession) valid() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.ended && time.Now().Before(s.until)
}

// over reports whether s has ended (false for no session: lease only).
func (s *lockSession) over() bool {
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ended
}

// lockKey is the key of s for the queries; nil (lease only) for no session.
func (s *lockSession) lockKey() *int64 {
	if s == nil {
		return nil
	}
	return &s.key
}

// locking reports whether the relay holds a lock session: it needs a
// connection of its own to PostgreSQL, as LISTEN does.
func (r *engine) locking() bool { return !r.cfg.NoListen }

// session returns the current lock session (nil: none now).
func (r *engine) session() *lockSession {
	r.lockMu.Lock()
	defer r.lockMu.Unlock()
	return r.sess
}

// endedOwner is another relay's lock session seen ended.
type endedOwner struct {
	node string
	key  int64
}

// keepLock holds the relay's lock session until ctx ends, dialling again with
// backoff whenever it fails.
func (r *engine) keepLock(ctx context.Context) {
	// The session is one connection: it is dialled again at most
	// lockRedialMax apart, so that the relay works again soon after
	// PostgreSQL is back (a failover, a restart), whatever BackoffMax says.
	p := r.backoffPolicy()
	p.Max = max(p.Min, min(p.Max, lockRedialMax))
	bo := wait.New(p)
	for ctx.Err() == nil {
		start := time.Now()
		err := r.holdLock(ctx)
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) > r.cfg.Lease {
			bo.Reset()
		}
		d := bo.Next()
		r.log.Warn("lock connection lost: the partitions of its session are not worked until it is back", slog.Any("error", err), slog.Duration("retry_in", d))
		wait.Sleep(ctx, d)
	}
}

// holdLock dials the lock connection, takes a new key, registers it, and
// checks the session every lockCheckEvery until the connection fails or ctx
// ends. The session ends with it: its workers stop.
func (r *engine) holdLock(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	cc := r.cfg.ListenConnConfig
	if cc == nil {
		cc = r.cfg.Pool.Config().ConnConfig
	}
	conn, err := pgx.ConnectConfig(cctx, cc.Copy())
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()
	var key int64
	for locked := false; !locked; {
		key = rand.Int64() // non-negative: classid fits in 31 bits
		if locked, err = r.q.TryLockKey(cctx, conn, key); err != nil {
			return fmt.Errorf("lock: %w", err)
		}
	}
	s := newLockSession(key)
	sent := time.Now()
	released, err := r.q.RegisterLockKey(cctx, conn, db.RegisterLockKeyParams{NodeID: r.cfg.NodeID, LockKey: key})
	if err != nil {
		return fmt.Errorf("register lock key: %w", err)
	}
	if released > 0 {
		r.log.Info("released the leases of an earlier lock session", slog.Int64("partitions", released))
		_ = r.q.NotifyRelays(cctx, conn, "released by "+r.cfg.NodeID)
	}
	cancel()
	s.confirm(sent)
	r.lockMu.Lock()
	r.sess = s
	r.lockMu.Unlock()
	defer r.endSession(s)
	r.kickHeartbeat()

	t := time.NewTicker(lockCheckEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
		sent := time.Now()
		ended, err := r.q.EndedLockSessions(qctx, conn, r.cfg.NodeID)
		cancel()
		if err != nil {
			return fmt.Errorf("check: %w", err)
		}
		s.confirm(sent)
		r.noteEnded(ended)
	}
}

// endSession ends s and stops the workers started under it.
func (r *engine) endSession(s *lockSession) {
	s.end()
	r.lockMu.Lock()
	if r.sess == s {
		r.sess = nil
	}
	r.lockMu.Unlock()
	r.mu.Lock()
	for _, w := range r.workers {
		if w.sess == s {
			w.stop(false)
		}
	}
	r.mu.Unlock()
}

// noteEnded records the other relays' sessions seen ended in the last check,
// keeping when each was first seen, and asks for a heartbeat lockValidFor
// after a new one: the partitions held under it can be taken then.
func (r *engine) noteEnded(rows []db.EndedLockSessionsRow) {
	now := time.Now()
	r.lockMu.Lock()
	defer r.lockMu.Unlock()
	seen := make(map[endedOwner]time.Time, len(rows))
	for _, row := range rows {
		o := endedOwner{node: row.NodeID, key: row.LockKey}
		if at, ok := r.ended[o]; ok {
			seen[o] = at
			continue
		}
		seen[o] = now
		r.log.Info("a relay's lock session ended: its partitions move in "+lockValidFor.String(), slog.String("owner", o.node))
		time.AfterFunc(lockValidFor, r.kickHeartbeat)
	}
	r.ended = seen
}

// takeable returns the ended sessions first seen at least lockValidFor ago,
// as AcquirePartitions takes them.
func (r *engine) takeable() (owners []string, keys []int64) {
	r.lockMu.Lock()
	defer r.lockMu.Unlock()
	owners, keys = []string{}, []int64{}
	for o, at := range r.ended {
		if time.Since(at) >= lockValidFor {
			owners, keys = append(owners, o.node), append(keys, o.key)
		}
	}
	return owners, keys
}
