package brokertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
)

// publishRetrying publishes msgs the way the relay does: after a transient
// failure it retries from each key's first failed message, in order, until
// every message is confirmed or d passes. It checks on every round that no
// key has a later message confirmed after an earlier one failed, and returns
// how many publishes failed.
func publishRetrying(t *testing.T, p broker.Publisher, msgs []pgrelay.Message, d time.Duration) (failures int) {
	t.Helper()
	end := time.Now().Add(d)
	pending := msgs
	for round := 0; len(pending) > 0; round++ {
		if time.Now().After(end) {
			t.Fatalf("%d messages still not confirmed after %s", len(pending), d)
		}
		res := p.Publish(timeout(t, 15*time.Second), pending)
		failed := map[string]bool{}
		var next []pgrelay.Message
		for i, r := range res {
			m := pending[i]
			if r.Err == nil {
				if failed[m.Key] {
					t.Fatalf("round %d: %s confirmed after an earlier message of key %q failed", round, m.EventID, m.Key)
				}
				continue
			}
			if broker.IsTerminal(r.Err) {
				t.Fatalf("round %d: %s failed permanently during a transient failure: %v", round, m.EventID, r.Err)
			}
			failed[m.Key] = true
			next = append(next, m)
		}
		failures += len(next)
		if len(next) > 0 {
			time.Sleep(200 * time.Millisecond)
		}
		pending = next
	}
	return failures
}

// cut stops the proxy (closing every connection through it), keeps it down
// for down, and starts it again on the same address. It may run on another
// goroutine than the test's.
func cut(t *testing.T, stop func(), start func() error, down time.Duration) {
	stop()
	time.Sleep(down)
	if err := start(); err != nil {
		t.Errorf("brokertest: restart the proxy: %v", err)
	}
}

// addLatency delays everything through px by d each way until the returned
// function removes it.
func addLatency(t *testing.T, px *toxiproxy.Proxy, name string, d time.Duration) (remove func()) {
	t.Helper()
	var names []string
	for _, dir := range []string{"upstream", "downstream"} {
		n := name + "_" + dir
		js := fmt.Sprintf(`{"name":%q,"type":"latency","stream":%q,"toxicity":1,"attributes":{"latency":%d}}`, n, dir, d.Milliseconds())
		if _, err := px.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
			t.Fatalf("brokertest: latency toxic: %v", err)
		}
		names = append(names, n)
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, n := range names {
			_ = px.Toxics.RemoveToxic(ctx, n)
		}
	}
}

// interleaved returns n messages of each of keys a, b and c, interleaved as
// an outbox would hold them.
func interleaved(ns string, n int) []pgrelay.Message {
	var msgs []pgrelay.Message
	for i := range n {
		for _, k := range []string{"a", "b", "c"} {
			msgs = append(msgs, message(ns, k, i))
		}
	}
	return msgs
}

// checkKeyOrder fails unless, for every key, the first deliveries of its
// events come in publish order.
func checkKeyOrder(t *testing.T, msgs []pgrelay.Message, got []broker.Delivery) {
	t.Helper()
	want := map[string][]string{}
	for _, m := range msgs {
		want[m.Key] = append(want[m.Key], m.EventID)
	}
	byKey := map[string][]broker.Delivery{}
	for _, d := range got {
		byKey[d.Message.Key] = append(byKey[d.Message.Key], d)
	}
	for k, w := range want {
		if g := distinctIDs(byKey[k]); !slices.Equal(g, w) {
			t.Fatalf("key %q received in order %v, want %v", k, g, w)
		}
	}
}

// testPerKeyOrder publishes batches of three keys through two transient
// failures: the connection cut in the middle of a batch, and (with
// Harness.AckTimeout) acknowledgements held back past the adapter's ack
// timeout for a moment, so that a key's message fails while the ones after it
// could go through. In no Publish may a key have a later message confirmed
// after an earlier one failed (the relay retries from the failed one), and
// what arrives is in publish order per key.
func testPerKeyOrder(t *testing.T, h Harness) {
	if h.Proxied == nil {
		t.Skip("the harness has no Proxied capability: cannot cut the connection")
	}
	ph, px := h.Proxied(t)
	ns := Namespace("order")
	p, s := newPair(t, ph, ns, "c")
	var all []pgrelay.Message

	// The connection cut while a slow batch is in flight (each key's
	// messages, confirmed one after another, take about a second). An
	// adapter that pipelines its confirms can finish a batch before the
	// cut; then a fresh batch is cut sooner, until a cut lands inside one.
	remove := addLatency(t, px, "slow", 10*time.Millisecond)
	var wg sync.WaitGroup
	failures := 0
	for i, after := range []time.Duration{300 * time.Millisecond, 100 * time.Millisecond, 30 * time.Millisecond, 5 * time.Millisecond} {
		msgs := interleaved(fmt.Sprintf("%s-cut%d", ns, i), 50)
		all = append(all, msgs...)
		wg.Go(func() {
			time.Sleep(after)
			cut(t, px.Stop, px.Start, 0)
		})
		failures = publishRetrying(t, p, msgs, 60*time.Second)
		wg.Wait()
		if failures > 0 {
			break
		}
		t.Logf("the batch was confirmed before a cut %s after its start; cutting sooner", after)
	}
	if failures == 0 {
		t.Fatal("no publish failed although the connection was cut during four batches")
	}
	var msgs []pgrelay.Message

	// Acknowledgements held back past the ack timeout, then let through.
	if h.AckTimeout > 0 {
		msgs = interleaved(ns+"-slow", 50)
		all = append(all, msgs...)
		wg.Go(func() {
			time.Sleep(100 * time.Millisecond)
			remove := addLatency(t, px, "stall", h.AckTimeout)
			time.Sleep(h.AckTimeout + 500*time.Millisecond)
			remove()
		})
		n := publishRetrying(t, p, msgs, 60*time.Second)
		wg.Wait()
		if n == 0 {
			t.Fatalf("no publish failed although acknowledgements were held back for %s", h.AckTimeout)
		}
		failures += n
	}
	remove()
	t.Logf("%d publishes failed transiently and were retried", failures)
	got := fetchUntil(t, s, h.RedeliveryTimeout+30*time.Second, haveAll(ids(all)))
	checkKeyOrder(t, all, got)
	ackAll(t, got)
}

// reconnects checks that p and s work, calls fault, and checks that they
// work again without being recreated.
func reconnects(t *testing.T, h Harness, p broker.Publisher, s broker.Subscriber, ns string, fault func()) {
	t.Helper()
	before := message(ns, "k", 0)
	publishOK(t, p, []pgrelay.Message{before})
	got := fetchUntil(t, s, h.RedeliveryTimeout, haveAll([]string{before.EventID}))
	ackAll(t, got)
	fault()
	after := messages(ns, "k", 3)[1:]
	publishRetrying(t, p, after, 60*time.Second)
	var again []broker.Delivery
	end := time.Now().Add(60 * time.Second)
	for !haveAll(ids(after))(again) && time.Now().Before(end) {
		again = append(again, fetchUntil(t, s, time.Second, haveAll(ids(after)))...)
	}
	if !haveAll(ids(after))(again) {
		t.Fatalf("after the fault received %v, want %v", distinctIDs(again), ids(after))
	}
	// Acks may fail while the connection recovers; the redelivery after a
	// failed ack is the broker's job, so retry until acks go through.
	ctx := timeout(t, 60*time.Second)
	for _, d := range again {
		var err error
		for range 50 {
			if err = d.Ack(ctx); err == nil {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if err != nil && !errors.Is(err, ctx.Err()) {
			t.Fatalf("ack %s after the fault: %v", d.Ref, err)
		}
	}
}

// testReconnectAfterCut: a publisher and a subscriber recover by themselves
// from a cut connection.
func testReconnectAfterCut(t *testing.T, h Harness) {
	if h.Proxied == nil {
		t.Skip("the harness has no Proxied capability: cannot cut the connection")
	}
	ph, px := h.Proxied(t)
	ns := Namespace("cut")
	p, s := newPair(t, ph, ns, "c")
	reconnects(t, ph, p, s, ns, func() { cut(t, px.Stop, px.Start, 2*time.Second) })
}

// testReconnectAfterRestart: a publisher and a subscriber recover by
// themselves from a broker restart.
func testReconnectAfterRestart(t *testing.T, h Harness) {
	if h.Restartable == nil {
		t.Skip("the harness has no Restartable capability: cannot restart the broker")
	}
	rh, restart := h.Restartable(t)
	ns := Namespace("restart")
	p, s := newPair(t, rh, ns, "c")
	reconnects(t, rh, p, s, ns, func() { restart(t) })
}
