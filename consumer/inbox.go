package consumer

import (
	"time"

	"github.com/pgrelay/pgrelay"
)

// teeObserver tells a and b (when not nil) every state change of the
// inbox, and the sequence outcomes to those that listen.
func teeObserver(a, b pgrelay.InboxObserver) pgrelay.InboxObserver {
	if b == nil {
		return a
	}
	return tee{a, b}
}

type tee struct{ a, b pgrelay.InboxObserver }

func (t tee) Received(inserted, duplicates int) {
	t.a.Received(inserted, duplicates)
	t.b.Received(inserted, duplicates)
}
func (t tee) Claimed(n, takeovers int) { t.a.Claimed(n, takeovers); t.b.Claimed(n, takeovers) }
func (t tee) Processed(ev *pgrelay.InboxEvent, d time.Duration) {
	t.a.Processed(ev, d)
	t.b.Processed(ev, d)
}
func (t tee) Retried(ev *pgrelay.InboxEvent, reason string) {
	t.a.Retried(ev, reason)
	t.b.Retried(ev, reason)
}
func (t tee) Deferred(ev *pgrelay.InboxEvent)            { t.a.Deferred(ev); t.b.Deferred(ev) }
func (t tee) Dead(ev *pgrelay.InboxEvent, reason string) { t.a.Dead(ev, reason); t.b.Dead(ev, reason) }
func (t tee) Fenced(ev *pgrelay.InboxEvent)              { t.a.Fenced(ev); t.b.Fenced(ev) }
func (t tee) Sequence(o pgrelay.SeqOutcome, n int) {
	for _, x := range []pgrelay.InboxObserver{t.a, t.b} {
		if s, ok := x.(pgrelay.SequenceObserver); ok {
			s.Sequence(o, n)
		}
	}
}

// retentionTee tells both observers what the inbox's upkeep did.
type retentionTee struct {
	a, b pgrelay.InboxRetentionObserver
}

func (t retentionTee) Deleted(n int64)  { t.a.Deleted(n); t.b.Deleted(n) }
func (t retentionTee) Failed(err error) { t.a.Failed(err); t.b.Failed(err) }
