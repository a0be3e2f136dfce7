package relay

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay/internal/event"
)

// TestPublishesKeySeq: the relay publishes each keyed event's per-key
// sequence as Pgrelay-Key-Seq, in order; an event without a key carries none.
func TestPublishesKeySeq(t *testing.T) {
	t.Parallel()
	b := setup(t)
	start(t, b.testConfig(t, b.publisher(t), &countingObserver{}))
	sub := b.subscribe(t)

	keyed := msgs(3, "order-9", "s")
	free := msgs(1, "", "free")
	b.enqueue(t, append(keyed, free...)...)
	b.waitCount(t, "published", 4, 10*time.Second)
	got := map[string]string{}
	for len(got) < 4 {
		select {
		case r := <-sub:
			got[r.eventID] = ""
			if v := r.headers[event.HeaderKeySeq]; len(v) > 0 {
				got[r.eventID] = v[0]
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("only %d messages arrived", len(got))
		}
	}
	for i := range keyed {
		require.Equal(t, strconv.Itoa(i+1), got[keyed[i].EventID])
	}
	require.Equal(t, "", got["free-0"])
}
