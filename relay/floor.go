package relay

import (
	"sync"
	"time"

	"github.com/pgrelay/pgrelay/internal/db"
)

// scanFloor keeps a partition's claims from walking the pending index's
// entries of rows the relay has already published. Every mark leaves a dead
// entry in outbox_pending_idx, in id order, and while any transaction holds
// the xmin horizon (a long report, a forgotten session) nothing removes
// them: neither vacuum nor an index scan's own cleanup. A claim that scans
// from the start walks every one of them and visits its heap tuple, so with
// a horizon held for minutes each claim took longer than the last (223 ms
// after 10 minutes at 1,000 events/s, docs/benchmarks.md "Held horizon").
//
// A claim reads the rows without a delay (not_before NULL) with id > after.
// after may pass an id only once no row with that id or a lower one can
// still commit: a row below it committing late would be skipped, and a
// later row of its key published first. What makes that knowable:
//
//   - The outbox's insert trigger takes its transaction's id (xid) before
//     the row's id (migration 00121), and ids come from one sequence in the
//     order they are drawn.
//   - So when a claim saw a committed row with id v, every transaction that
//     drew an id below v had its xid before that claim ran, and before the
//     mark of the batch that follows it took its own xid m (xids are
//     assigned in order): every such transaction's xid is below m.
//   - A later claim whose snapshot's xmin (the oldest xid still running) is
//     at least m therefore sees every row with an id up to v that will ever
//     commit. The pending ones among them are the ones it returns (it reads
//     in id order), those of the batch whose mark is still in flight, and
//     rows held behind a key's delayed row (then nothing moves).
//
// A transaction holding the horizon without writing has no xid and holds
// nothing back; one that writes holds the floor where it is until it ends
// (the claims then scan as before it). The floor lives in the worker: a
// new leaseholder starts from the start. Rows put back to pending below it
// (relay requeue) are read by a claim from the start: at once when the
// requeue's notification (AdminNotifyOutbox) arrives, or the LISTEN
// connection is re-established (notifications meanwhile are lost), and
// otherwise (a requeue by hand, say) at least every floorFullEvery, or
// floorFullFactor times as long as the last one took, at most every
// floorMaxEvery. A claim from the start walks every dead entry: under a
// 10-minute hold at 1,000 events/s about 200 ms, so with 20 times (the
// inbox's claimFloor) the 16 partitions' claims from the start took most
// of a core.
type scanFloor struct {
	mu    sync.Mutex
	after int64 // claims read rows without a delay with id > after
	// cand is the next floor: rows up to id are settled once no xid below
	// xid runs (0: none).
	cand     struct{ id, xid int64 }
	lastFull time.Time     // when the last claim from the start began
	every    time.Duration // how often a claim starts from the start
	// fullEvery and maxEvery replace floorFullEvery and floorMaxEvery when
	// positive (tests).
	fullEvery, maxEvery time.Duration
}

const (
	floorFullEvery  = 5 * time.Second
	floorFullFactor = 300
	floorMaxEvery   = time.Minute
	// floorSchema is the migration the floor's reasoning needs
	// (00121_outbox_xid_before_id): on a database below it (served, see
	// minSchemaTable) every claim scans from the start.
	floorSchema int64 = 121
)

// start returns where a claim beginning at now starts: after, or 0 (from
// the start) when a claim from the start is due.
func (f *scanFloor) start(now time.Time) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	full, most := floorFullEvery, floorMaxEvery
	if f.fullEvery > 0 {
		full, most = f.fullEvery, f.maxEvery
	}
	if f.lastFull.IsZero() || now.Sub(f.lastFull) >= min(max(f.every, full), most) {
		f.lastFull = now
		return 0
	}
	return f.after
}

// reset forgets the floor: the next claim starts from the start, and
// nothing learnt before counts.
func (f *scanFloor) reset() {
	f.mu.Lock()
	f.after, f.cand.id, f.cand.xid, f.lastFull = 0, 0, 0, time.Time{}
	f.mu.Unlock()
}

// rescan makes the next claim start from the start.
func (f *scanFloor) rescan() {
	f.mu.Lock()
	f.lastFull = time.Time{}
	f.mu.Unlock()
}

// read records a claim that started past from (0: the start), took took
// and returned rows (none: nothing to learn), all from one snapshot whose
// xmin they carry; inflight are the rows of the batch whose mark was in
// flight, which the claim skipped.
func (f *scanFloor) read(from int64, took time.Duration, rows []db.PendingBatchRow, inflight []int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if from == 0 {
		f.every = floorFullFactor * took
	}
	if len(rows) == 0 {
		return
	}
	// The lowest row returned: nothing pending below it was skipped but
	// the in-flight batch and held rows. (A delayed row, read in its own
	// branch, may lie lower: that only keeps the floor lower.)
	low := rows[0].ID
	for _, row := range rows[1:] {
		low = min(low, row.ID)
	}
	for _, id := range inflight {
		low = min(low, id)
	}
	if from == 0 && low-1 < f.after {
		f.after = low - 1 // a requeued row below the floor
	}
	if f.cand.xid == 0 || rows[0].SnapshotXmin < f.cand.xid || rows[0].Waiting {
		return
	}
	if next := min(f.cand.id, low-1); next > f.after {
		f.after = next
	}
	f.cand.id, f.cand.xid = 0, 0
}

// marked records that the mark of a batch whose greatest row id is id
// committed in transaction xid: it becomes the next floor, unless one is
// already waiting to settle.
func (f *scanFloor) marked(id, xid int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cand.xid == 0 && xid > 0 && id > f.after {
		f.cand.id, f.cand.xid = id, xid
	}
}
