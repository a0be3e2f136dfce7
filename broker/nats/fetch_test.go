package nats_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	pgnats "github.com/pgrelay/pgrelay/broker/nats"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/testnats"
)

// TestFetchOfACaughtUpConsumerAsksTwice: a consumer that has caught up
// fetches a batch with two pull requests at most, one waiting for the first message
// and one for the rest. (Asking first for whatever was available, empty once caught up, took
// three pull requests per batch: at moderate loads, a third of the consumer's
// requests to the server.)
func TestFetchOfACaughtUpConsumerAsksTwice(t *testing.T) {
	t.Parallel()
	url := testnats.URL(t)
	stream, prefix := testnats.Stream(t, url)
	nc, js := testnats.Connect(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := pgnats.NewSubscriber(ctx, pgnats.Config{URL: url, Stream: stream, SubjectPrefix: prefix, Durable: "twice"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if _, err := s.Fetch(ctx, 10, 20*time.Millisecond); err != nil {
		t.Fatalf("first fetch (attach): %v", err)
	}
	// Every pull request of the durable, as the server receives it.
	var pulls atomic.Int64
	sub, err := nc.Subscribe(fmt.Sprintf("$JS.API.CONSUMER.MSG.NEXT.%s.twice", stream), func(*nats.Msg) { pulls.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	for round := range 5 {
		before := pulls.Load()
		go func() {
			time.Sleep(50 * time.Millisecond) // the fetch is waiting
			for i := range 3 {
				m := nats.NewMsg(prefix + ".orders")
				m.Header.Set(event.HeaderEventID, fmt.Sprintf("r%d-%d", round, i))
				m.Header.Set(event.HeaderEventType, "T")
				if _, err := js.PublishMsgAsync(m); err != nil {
					t.Error(err)
				}
			}
		}()
		var got []string
		calls := int64(0)
		for len(got) < 3 {
			calls++ // the three may reach the server across two fetches
			ds, err := s.Fetch(ctx, 10, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range ds {
				got = append(got, d.Message.EventID)
				if err := d.Ack(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := nc.Flush(); err != nil { // the pull requests seen so far are counted
			t.Fatal(err)
		}
		if n := pulls.Load() - before; n > 2*calls {
			t.Errorf("round %d: %d pull requests in %d fetches for %s, want 2 a fetch at most", round, n, calls, strings.Join(got, ","))
		}
	}
}
