package relay

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/internal/event"
)

// everyThirdFails fails every third Publish call at once, before sending:
// the lane that made it retries while the others go on.
type everyThirdFails struct {
	broker.Publisher
	calls atomic.Int64
}

func (p *everyThirdFails) Publish(ctx context.Context, msgs []pgrelay.Message) []broker.Result {
	if p.calls.Add(1)%3 == 0 {
		res := make([]broker.Result, len(msgs))
		for i := range res {
			res[i].Err = fmt.Errorf("broker hiccup (test)")
		}
		return res
	}
	return p.Publisher.Publish(ctx, msgs)
}

// TestWALLanesKeepKeyOrder: the WAL capture publishes in several lanes at
// once, a key always in the same one; while publishes fail and are retried
// in some lanes and not in others, every key's events still reach the
// broker in commit order, numbered 1, 2, 3, ... without a gap.
func TestWALLanesKeepKeyOrder(t *testing.T) {
	b, _ := walSetup(t, walConf)
	ch := b.subscribe(t)
	pub := &everyThirdFails{Publisher: b.publisher(t)}
	cfg := b.walConfig(t, pub, &countingObserver{})
	cfg.BatchSize = 20
	r, _ := start(t, cfg)
	waitReading(t, r)

	const keys, txs, perTx = 24, 120, 4
	next := map[string]int{}
	for tx := range txs {
		var ms []pgrelay.Message
		for i := range perTx {
			k := fmt.Sprintf("key-%d", (tx*perTx+i)%keys)
			next[k]++
			ms = append(ms, pgrelay.Message{EventID: fmt.Sprintf("%s-%d", k, next[k]), Topic: "orders", Key: k, Payload: []byte(strconv.Itoa(next[k]))})
		}
		b.emit(t, ms...)
	}
	seen := map[string]bool{}
	last := map[string]int{}
	deadline := time.After(60 * time.Second)
	for len(seen) < txs*perTx {
		select {
		case m := <-ch:
			if seen[m.eventID] {
				continue // a retried publish the broker took twice
			}
			seen[m.eventID] = true
			n, err := strconv.Atoi(string(m.data))
			require.NoError(t, err)
			require.Equal(t, last[m.key]+1, n, "key %s: commit order", m.key)
			require.Equal(t, strconv.Itoa(n), hdr(m, event.HeaderKeySeq), "key %s: numbered in commit order", m.key)
			last[m.key] = n
		case <-deadline:
			t.Fatalf("got %d of %d events", len(seen), txs*perTx)
		}
	}
	require.Greater(t, pub.calls.Load(), int64(txs*perTx/cfg.BatchSize), "published in lanes, failures retried")
}

// blockKey holds every publish carrying key until released.
type blockKey struct {
	broker.Publisher
	key     string
	release chan struct{}
	once    sync.Once
	held    chan struct{}
}

func (p *blockKey) Publish(ctx context.Context, msgs []pgrelay.Message) []broker.Result {
	for _, m := range msgs {
		if m.Key == p.key {
			p.once.Do(func() { close(p.held) })
			<-p.release
			break
		}
	}
	return p.Publisher.Publish(ctx, msgs)
}

// TestWALConfirmsAfterEveryLane: while one lane's publish hangs, the other
// lanes publish the rest of its transaction and the transaction after it,
// but the slot's confirmed position stays before the hung event's
// transaction; released, it moves past all of them.
func TestWALConfirmsAfterEveryLane(t *testing.T) {
	b, _ := walSetup(t, walConf)
	ch := b.subscribe(t)
	pub := &blockKey{Publisher: b.publisher(t), key: "slow", release: make(chan struct{}), held: make(chan struct{})}
	defer func() {
		select {
		case <-pub.release:
		default:
			close(pub.release)
		}
	}()
	cfg := b.walConfig(t, pub, &countingObserver{})
	r, _ := start(t, cfg)
	waitReading(t, r)

	// One transaction with the slow key's event and others in the other
	// lanes, then a second one in the other lanes.
	var fast [2][]pgrelay.Message
	for i := range 60 {
		k := fmt.Sprintf("fast-%d", i)
		if laneOf(&pgrelay.Message{Key: k}) != laneOf(&pgrelay.Message{Key: "slow"}) {
			fast[i%2] = append(fast[i%2], pgrelay.Message{EventID: k, Topic: "orders", Key: k, Payload: []byte("f")})
		}
	}
	require.Greater(t, len(fast[0]), 10)
	b.emit(t, append([]pgrelay.Message{{EventID: "slow-1", Topic: "orders", Key: "slow", Payload: []byte("s")}}, fast[0]...)...)
	_, afterSlow := b.slotConfirmed(t, DefaultWALSlot)
	select {
	case <-pub.held:
	case <-time.After(20 * time.Second):
		t.Fatal("the slow event was not published")
	}
	b.emit(t, fast[1]...)
	got := readAll(t, ch, len(fast[0])+len(fast[1]), 20*time.Second)
	for _, m := range got {
		require.NotEqual(t, "slow-1", m.eventID)
	}
	// One more in another lane: the publisher goes round again.
	b.emit(t, pgrelay.Message{EventID: "again", Topic: "orders", Key: fast[1][0].Key, Payload: []byte("a")})
	readAll(t, ch, 1, 20*time.Second)
	require.Never(t, func() bool { // over several status updates
		confirmed, _ := b.slotConfirmed(t, DefaultWALSlot)
		return confirmed >= afterSlow
	}, 3*time.Second, 50*time.Millisecond, "confirmed past an event not acknowledged")

	close(pub.release)
	readAll(t, ch, 1, 20*time.Second)
	require.Eventually(t, func() bool {
		confirmed, current := b.slotConfirmed(t, DefaultWALSlot)
		return confirmed >= current-1024
	}, 20*time.Second, 50*time.Millisecond)
}
