package relay

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/pgrelay/pgrelay/internal/db"
)

// marker sends the marks of a Relay's partition workers to the database,
// coalescing them like a group commit: a mark handed to an idle marker goes
// out at once, in a statement of its own; the marks handed to it while a
// statement is in flight go out together in the next one (MarkOutcomesMany),
// which waits for one WAL flush instead of one each. Each worker waits for
// its own mark's outcome, as it waited for its own statement before.
//
// A statement holds at most one mark per partition: the lease check of a
// partition covers all its rows in the statement, so two marks of the same
// partition at different epochs must not share one. (A Relay runs one
// worker per partition at a time, each awaiting its previous mark, so this
// is a safeguard.)
type marker struct {
	r *engine

	mu      sync.Mutex
	queue   []*markRequest
	running bool // a goroutine is sending the queue's marks
}

// markRequest is one partition's mark handed to the marker.
type markRequest struct {
	partition int32
	epoch     int64
	ids       []int64  // the rows to mark: published but for deadIDs
	deadIDs   []int64  // never nil
	reasons   []string // never nil; one per deadIDs
	async     bool     // may commit without waiting for its WAL flush
	// round is the poll round of the batch (nil: none); the request
	// arrives in it once queued.
	round *pollRound
	done  chan markResult
}

// markResult is a mark's outcome: how many of its rows were marked (0: the
// partition's lease was not held at the mark's epoch), or the statement's
// error.
type markResult struct {
	marked int64
	xid    int64 // the statement's transaction (see scanFloor)
	err    error
}

// mark hands req to the marker and waits for its outcome. A caller that
// finds the marker idle sends the statement itself, on its own goroutine
// (no goroutine to start and hand over to and back, per mark): the
// statements carrying its mark, then, if marks were queued meanwhile, it
// hands them to a goroutine and returns.
//
// A mark of a poll round that finds the marker idle first waits for the
// round's other marks (pollRound.wait, at most roundWait), so that they go
// in its statement.
func (m *marker) mark(req *markRequest) markResult {
	req.done = make(chan markResult, 1)
	m.mu.Lock()
	m.queue = append(m.queue, req)
	req.round.arrive()
	if m.running {
		m.mu.Unlock()
		return <-req.done
	}
	m.running = true
	m.mu.Unlock()
	req.round.wait()
	m.run(req)
	return <-req.done
}

// run sends the queued marks, as many at once as are queued (one per
// partition), until the queue is empty or, with own, until own's statement
// has been sent: the queue's other marks then go on in a goroutine.
func (m *marker) run(own *markRequest) {
	for {
		m.mu.Lock()
		batch := m.take()
		if len(batch) == 0 {
			m.running = false
			m.mu.Unlock()
			return
		}
		m.mu.Unlock()
		m.send(batch)
		if own != nil && slices.Contains(batch, own) {
			m.mu.Lock()
			if len(m.queue) == 0 {
				m.running = false
			} else {
				go m.run(nil)
			}
			m.mu.Unlock()
			return
		}
	}
}

// take removes from the queue the marks of the next statement: every queued
// mark but those of a partition already in it, which stay queued, in order.
// Called with m.mu held.
func (m *marker) take() []*markRequest {
	if len(m.queue) == 0 {
		return nil
	}
	batch := make([]*markRequest, 0, len(m.queue))
	var rest []*markRequest
	seen := make(map[int32]bool, len(m.queue))
	for _, req := range m.queue {
		if seen[req.partition] {
			rest = append(rest, req)
			continue
		}
		seen[req.partition] = true
		batch = append(batch, req)
	}
	m.queue = rest
	return batch
}

// send marks batch in one statement and hands each mark its outcome: a
// statement's failure is every mark's.
func (m *marker) send(batch []*markRequest) {
	results := make(map[int32]db.MarkOutcomesManyRow, len(batch))
	err := func() (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("panic while marking: %v", p)
			}
		}()
		if h := m.r.cfg.hooks.beforeMarkStatement; h != nil {
			parts := make([]int32, len(batch))
			for i, req := range batch {
				parts[i] = req.partition
			}
			h(parts)
		}
		arg := db.MarkOutcomesManyParams{
			Owner:       m.r.cfg.NodeID,
			Partitions:  make([]int32, 0, len(batch)),
			Epochs:      make([]int64, 0, len(batch)),
			Ids:         []int64{},
			DeadIds:     []int64{},
			DeadReasons: []string{},
			AsyncCommit: true,
		}
		for _, req := range batch {
			arg.Partitions = append(arg.Partitions, req.partition)
			arg.Epochs = append(arg.Epochs, req.epoch)
			arg.Ids = append(arg.Ids, req.ids...)
			arg.DeadIds = append(arg.DeadIds, req.deadIDs...)
			arg.DeadReasons = append(arg.DeadReasons, req.reasons...)
			// A mark that must wait for its WAL flush makes the whole
			// statement wait.
			arg.AsyncCommit = arg.AsyncCommit && req.async
		}
		qctx, cancel := context.WithTimeout(context.Background(), m.r.cfg.QueryTimeout)
		defer cancel()
		rows, err := m.r.q.MarkOutcomesMany(qctx, m.r.cfg.Pool, arg)
		if err != nil {
			return err
		}
		for _, row := range rows {
			results[row.Partition] = row
		}
		return nil
	}()
	for _, req := range batch {
		if err != nil {
			req.done <- markResult{err: err}
			continue
		}
		res := results[req.partition]
		req.done <- markResult{marked: res.Marked, xid: res.Xid}
	}
}
