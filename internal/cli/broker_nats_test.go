package cli

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/internal/setting"
)

// failingSubscriber fails every fetch with err.
type failingSubscriber struct {
	broker.Subscriber
	err error
}

func (s failingSubscriber) Fetch(context.Context, int, time.Duration) ([]broker.Delivery, error) {
	return nil, s.err
}

// TestNATSSubscriberRefusalNamesTheFlags: a permanent refusal naming the
// subscriber's settings (a stream outliving the dedup window) reaches the
// consumer naming its flags, and stays permanent.
func TestNATSSubscriberRefusalNamesTheFlags(t *testing.T) {
	t.Parallel()
	refusal := setting.Errorf("", "nats.Config", "DedupWindow",
		"stream keeps messages longer than {} %s; raise {} or set {AllowReplayBeyondDedupWindow}", time.Hour)
	opts := SubscriberOptions{Options: Options{{Flag: "dedup-window", Env: "DEDUP_WINDOW", Field: "Inbox.Retention.Window"}}}
	names := func(err error) error { return opts.names(err, natsConsumerFlags) }
	sub := &namedSubscriber{Subscriber: failingSubscriber{err: broker.Terminal(refusal)}, names: names}
	_, err := sub.Fetch(context.Background(), 1, time.Millisecond)
	require.True(t, broker.IsTerminal(err))
	require.EqualError(t, err, "permanent: stream keeps messages longer than --dedup-window (DEDUP_WINDOW) 1h0m0s; raise "+
		"--dedup-window (DEDUP_WINDOW) or set --allow-replay-beyond-dedup-window (CONSUMER_ALLOW_REPLAY_BEYOND_DEDUP_WINDOW)")
}
