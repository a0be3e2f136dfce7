package consumer

import (
	"log/slog"

	"github.com/pgrelay/pgrelay"
)

// reportIdentity logs and counts what a stored batch's dedup keys revealed:
// key conflicts (the same key stored with another payload; the stored
// event's effect stands) and events stored dead because their key could not
// be built.
func (c *Consumer) reportIdentity(res pgrelay.ReceiveResult) {
	var perHandler map[string]int
	for _, a := range res.Absorbed {
		if !a.Conflict {
			continue
		}
		c.log.Warn("dedup key conflict: the key is stored with a different payload; the stored event's effect stands",
			slog.String("handler", a.Handler), slog.String("dedup_key", a.DedupKey),
			slog.String("stored_event_id", a.StoredEventID), slog.String("event_id", a.EventID))
		if perHandler == nil {
			perHandler = map[string]int{}
		}
		perHandler[a.Handler]++
	}
	for h, n := range perHandler {
		c.stats.conflicts.Add(int64(n))
		if c.cfg.observeConflicts != nil {
			c.cfg.observeConflicts(h, n)
		}
	}
	for _, f := range res.KeyFailures {
		c.log.Warn("event stored dead: its dedup key could not be built",
			slog.String("handler", f.Handler), slog.String("event_id", f.EventID), slog.String("reason", f.Reason))
	}
	c.stats.dead.Add(int64(len(res.KeyFailures)))
}
