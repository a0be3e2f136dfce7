package relay

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/pgrelay/pgrelay/internal/broker"
)

// publish calls the Publisher, turning a panic into a transient failure of
// the whole batch.
func (r *Relay) publish(msgs []broker.Message, leaseEnd time.Time) (results []broker.Result) {
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.PublishTimeout)
	defer cancel()
	ctx, cancelLease := context.WithDeadline(ctx, leaseEnd)
	defer cancelLease()
	defer func() {
		if p := recover(); p != nil {
			r.log.Error("publisher panicked", zap.Any("panic", p))
			results = make([]broker.Result, len(msgs))
			for i := range results {
				results[i].Err = fmt.Errorf("publisher panicked: %v", p)
			}
		}
	}()
	results = r.cfg.Publisher.Publish(ctx, msgs)
	if len(results) != len(msgs) {
		err := fmt.Errorf("publisher returned %d results for %d messages", len(results), len(msgs))
		results = make([]broker.Result, len(msgs))
		for i := range results {
			results[i].Err = err
		}
	}
	return results
}
