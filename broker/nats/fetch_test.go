package nats_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	pgnats "github.com/pgrelay/pgrelay/broker/nats"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/testnats"
)

// publishN publishes n messages with the event ids "<tag>-0" ... and waits
// for the stream to store them.
func publishN(t *testing.T, js jetstream.JetStream, prefix, tag string, n int) {
	t.Helper()
	for i := range n {
		m := nats.NewMsg(prefix + ".orders")
		m.Header.Set(event.HeaderEventID, fmt.Sprintf("%s-%d", tag, i))
		m.Header.Set(event.HeaderEventType, "T")
		if _, err := js.PublishMsgAsync(m); err != nil {
			t.Error(err)
			return
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		t.Error("publishes not acknowledged in 30s")
	}
}

// collect fetches from s, acknowledging, until it has want distinct event ids
// or d has passed, and returns the distinct ids it got.
func collect(ctx context.Context, t *testing.T, s *pgnats.Subscriber, max, want int, d time.Duration) map[string]bool {
	t.Helper()
	got := map[string]bool{}
	for end := time.Now().Add(d); len(got) < want && time.Now().Before(end); {
		ds, err := s.Fetch(ctx, max, 200*time.Millisecond)
		if err != nil {
			t.Logf("fetch: %v", err)
			continue
		}
		for _, d := range ds {
			got[d.Message.EventID] = true
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	return got
}

// TestFetchKeepsOnePullOpen: a consumer that has caught up and fetches a
// few messages at a time sends a pull request per half batch of messages
// delivered, not one or two per fetch: its pull subscription stays open
// across fetches. (A pull per fetch cost the consumer and the NATS server
// a subscription and a request for nearly every event at moderate loads.)
func TestFetchKeepsOnePullOpen(t *testing.T) {
	t.Parallel()
	url := testnats.URL(t)
	stream, prefix := testnats.Stream(t, url)
	nc, js := testnats.Connect(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := pgnats.NewSubscriber(ctx, pgnats.Config{URL: url, Stream: stream, SubjectPrefix: prefix, Durable: "open"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if _, err := s.Fetch(ctx, 100, 20*time.Millisecond); err != nil {
		t.Fatalf("first fetch (attach): %v", err)
	}
	// Every pull request of the durable, as the server receives it.
	var pulls atomic.Int64
	sub, err := nc.Subscribe(fmt.Sprintf("$JS.API.CONSUMER.MSG.NEXT.%s.open", stream), func(*nats.Msg) { pulls.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	const rounds, per = 10, 3
	fetches := 0
	for round := range rounds {
		go func() {
			time.Sleep(20 * time.Millisecond) // the fetch is waiting
			publishN(t, js, prefix, fmt.Sprintf("r%d", round), per)
		}()
		got := 0
		for got < per {
			fetches++ // the three may arrive across two fetches
			ds, err := s.Fetch(ctx, 100, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range ds {
				got++
				if err := d.Ack(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if err := nc.Flush(); err != nil { // the pull requests sent so far are counted
		t.Fatal(err)
	}
	// A batch of 100 keeps 50 requested and asks again once 25 more have
	// arrived; a pull request lasts 30s before it is renewed.
	limit := int64(rounds*per/25 + 1 + int(time.Since(start)/(30*time.Second)))
	if n := pulls.Load(); n > limit {
		t.Errorf("%d pull requests for %d messages in %d fetches of 100, want at most %d", n, rounds*per, fetches, limit)
	}
}

// TestFetchPrefetchesAtMostABatch: a subscriber holds at most about one
// batch of messages it has not handed out, so another subscriber of the
// same durable gets the rest; and what it holds when it closes is handed
// back, for the other to fetch at once rather than after AckWait.
func TestFetchPrefetchesAtMostABatch(t *testing.T) {
	t.Parallel()
	url := testnats.URL(t)
	stream, prefix := testnats.Stream(t, url)
	_, js := testnats.Connect(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	newSub := func() *pgnats.Subscriber {
		s, err := pgnats.NewSubscriber(ctx, pgnats.Config{URL: url, Stream: stream, SubjectPrefix: prefix,
			Durable: "shared", AckWait: 5 * time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	a, b := newSub(), newSub()
	if _, err := b.Fetch(ctx, 10, 20*time.Millisecond); err != nil { // b attaches first
		t.Fatalf("attach: %v", err)
	}
	const total, batch = 60, 10
	publishN(t, js, prefix, "m", total)
	ds, err := a.Fetch(ctx, batch, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) == 0 || len(ds) > batch {
		t.Fatalf("a fetched %d messages, want 1 to %d", len(ds), batch)
	}
	for _, d := range ds {
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// a now holds what it prefetched, about a batch; b gets the others.
	fromB := collect(ctx, t, b, batch, total-len(ds)-2*batch, 30*time.Second)
	if n := len(fromB); n < total-len(ds)-2*batch {
		t.Fatalf("b fetched %d of the %d messages a did not take, want at least %d: a holds more than its batch",
			n, total-len(ds), total-len(ds)-2*batch)
	}
	// Closing a hands its prefetched messages back: b gets every one long
	// before AckWait (5 minutes) would redeliver them.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	more := collect(ctx, t, b, batch, total-len(ds)-len(fromB), 30*time.Second)
	for id := range more {
		fromB[id] = true
	}
	for _, d := range ds {
		if fromB[d.Message.EventID] {
			t.Errorf("%s, fetched and acknowledged by a, delivered to b too", d.Message.EventID)
		}
	}
	if n := len(fromB) + len(ds); n != total {
		t.Fatalf("a and b fetched %d distinct messages of %d after a closed: a's prefetched messages were not handed back", n, total)
	}
}
