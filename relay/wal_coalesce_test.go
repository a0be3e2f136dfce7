package relay

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
)

// TestWALCoalescesWhileBusy: a quiet WAL capture publishes an event at once;
// once it is busy (lingerMinRows read lately), events committed one per
// transaction a few milliseconds apart go out several to a publish round
// (one numbering statement, one broker round trip) instead of one each, in
// commit order, once each.
func TestWALCoalescesWhileBusy(t *testing.T) {
	b, _ := walSetup(t, walConf)
	ch := b.subscribe(t)
	cfg := b.walConfig(t, b.publisher(t), &countingObserver{})
	cfg.hooks.walCoalesce = time.Second // long, to tell a pause from none
	var mu sync.Mutex
	var rounds []int
	cfg.hooks.walBeforePublish = func(n int) {
		mu.Lock()
		defer mu.Unlock()
		rounds = append(rounds, n)
	}
	r, _ := start(t, cfg)
	waitReading(t, r)

	ev := func(id string) pgrelay.Message {
		return pgrelay.Message{EventID: id, Topic: "orders", Key: "k", Payload: []byte(id)}
	}
	t0 := time.Now()
	b.emit(t, ev("quiet"))
	select {
	case m := <-ch:
		require.Equal(t, "quiet", m.eventID)
		require.Less(t, time.Since(t0), cfg.hooks.walCoalesce/2, "a quiet capture does not pause")
	case <-time.After(10 * time.Second):
		t.Fatal("the quiet event was not published")
	}

	mu.Lock()
	rounds = nil
	mu.Unlock()
	const n = 40
	for i := range n {
		b.emit(t, ev(fmt.Sprintf("e%02d", i)))
		time.Sleep(5 * time.Millisecond)
	}
	got := readAll(t, ch, n, 20*time.Second)
	for i, m := range got {
		require.Equal(t, fmt.Sprintf("e%02d", i), m.eventID, "commit order")
	}
	mu.Lock()
	defer mu.Unlock()
	// The first lingerMinRows go out as they come (the capture was quiet);
	// the rest in batches of up to busyPollFull: about 13 rounds in all,
	// against 40 without the pause.
	t.Logf("%d publish rounds: %v", len(rounds), rounds)
	require.LessOrEqual(t, len(rounds), n/2, "busy: several events a round")
}
