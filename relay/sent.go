package relay

import "sync"

// sentRowsMax bounds sentRows: rows another relay marked after this one
// stopped are never removed here, so the set is emptied when it grows past
// it (the rows it forgets can at worst be marked expired although the broker
// has them, as before the set existed).
const sentRowsMax = 1 << 16

// sentRows is the set of outbox rows with an expires_at this relay published
// (the broker confirmed them) that no mark has recorded yet. A mark that fails (the
// connection reset) or a worker stopped before its mark (its lock session
// ended) leaves such rows pending; read again after their expires_at, they
// would be marked dead as expired although the broker holds them. The relay
// publishes them again instead (a duplicate the broker or the inbox absorbs)
// and marks them published.
type sentRows struct {
	mu  sync.Mutex
	ids map[int64]struct{}
}

func (s *sentRows) add(ids []int64) {
	if len(ids) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ids == nil || len(s.ids) > sentRowsMax {
		s.ids = make(map[int64]struct{}, len(ids))
	}
	for _, id := range ids {
		s.ids[id] = struct{}{}
	}
}

func (s *sentRows) remove(ids []int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		delete(s.ids, id)
	}
}

func (s *sentRows) has(id int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.ids[id]
	return ok
}
