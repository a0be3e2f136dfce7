package kafka

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/brokertest"
	"github.com/pgrelay/pgrelay/internal/logtest"
)

// TestHeldPartitionIsLogged: a record left unacknowledged while the records
// after it in its partition are acknowledged holds the partition's committed
// offset. Once it has done so for the threshold the subscriber says so at
// warn, once, naming the partition, the offset and how many acknowledged
// records wait behind it; acknowledging it lets the offset move on.
func TestHeldPartitionIsLogged(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	ns := brokertest.Namespace("held")
	c.createTopic(t, ns+".orders", 1)
	cfg := withGroup(c.config(t, ns), ns)
	core, logs := logtest.Observe(slog.LevelWarn)
	cfg.Logger = core
	p := c.publisher(t, cfg)
	msgs := events(ns, []string{"k"}, 5)
	publishAll(t, p, msgs)

	s := c.subscriber(t, cfg)
	s.mu.Lock()
	s.heldAfter = 200 * time.Millisecond
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var got []broker.Delivery
	for len(got) < 5 && ctx.Err() == nil {
		ds, _ := s.Fetch(ctx, 5, 500*time.Millisecond)
		got = append(got, ds...)
	}
	for _, d := range got[1:] {
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	held := func() []logtest.Entry {
		return logs.FilterMessageSnippet("holds its partition's committed offset").All()
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(held()) == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if len(held()) != 1 {
		t.Fatalf("want one warning about the held partition, got %d", len(held()))
	}
	f := held()[0].ContextMap()
	if fmt.Sprint(f["topic"], f["partition"], f["offset"], f["acknowledged_after_it"]) != fmt.Sprint(ns+".orders", 0, 0, 4) {
		t.Fatalf("warning fields %v", f)
	}
	time.Sleep(500 * time.Millisecond) // several commit intervals: still once
	if n := len(held()); n != 1 {
		t.Fatalf("the held record was reported %d times, want once", n)
	}
	if err := got[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		committed := s.parts[topicPartition{ns + ".orders", 0}].committed
		s.mu.Unlock()
		if committed == 5 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("the offset did not move on once the held record was acknowledged")
}
