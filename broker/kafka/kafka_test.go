package kafka

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/brokertest"
	"github.com/pgrelay/pgrelay/internal/event"
)

// events returns n events for each key, interleaved as an outbox would hold
// them.
func events(ns string, keys []string, n int) []pgrelay.Message {
	var out []pgrelay.Message
	for i := range n {
		for _, k := range keys {
			out = append(out, pgrelay.Message{
				EventID: fmt.Sprintf("%s-%s-%d", ns, k, i), Topic: "orders", Key: k, EventType: "OrderPaid",
				Payload: fmt.Appendf(nil, `{"n":%d}`, i), OccurredAt: time.Unix(1700000000+int64(i), 0).UTC(),
			})
		}
	}
	return out
}

// publishAll publishes msgs as the relay does: after a transient failure it
// publishes again from each key's first failed event. It fails the test if a
// key ever has an event confirmed after an earlier one failed. It returns how
// many events failed transiently along the way.
func publishAll(t *testing.T, p *Publisher, msgs []pgrelay.Message) (failures int) {
	t.Helper()
	pending := msgs
	for round := 0; len(pending) > 0; round++ {
		if round > 20 {
			t.Fatalf("%d events still unconfirmed after %d rounds", len(pending), round)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		res := p.Publish(ctx, pending)
		cancel()
		failed := map[string]bool{}
		var next []pgrelay.Message
		for i, r := range res {
			m := pending[i]
			switch {
			case r.Err == nil && failed[m.Key]:
				t.Fatalf("round %d: %s confirmed after an earlier event of key %q failed", round, m.EventID, m.Key)
			case r.Err == nil:
			case broker.IsTerminal(r.Err):
				t.Fatalf("round %d: %s failed permanently: %v", round, m.EventID, r.Err)
			default:
				failed[m.Key] = true
				next = append(next, m)
				failures++
			}
		}
		pending = next
	}
	return failures
}

// inbox stands in for the consumer's inbox: it records every delivery by
// event id, as the inbox's unique key would.
type inbox struct {
	mu    sync.Mutex
	count map[string]int
	order map[string][]string // key -> event ids, first deliveries only
}

func newInbox() *inbox {
	return &inbox{count: map[string]int{}, order: map[string][]string{}}
}

func (ib *inbox) store(d broker.Delivery) (duplicate bool) {
	ib.mu.Lock()
	defer ib.mu.Unlock()
	ib.count[d.Message.EventID]++
	if ib.count[d.Message.EventID] > 1 {
		return true
	}
	ib.order[d.Message.Key] = append(ib.order[d.Message.Key], d.Message.EventID)
	return false
}

func (ib *inbox) has(ids []string) bool {
	ib.mu.Lock()
	defer ib.mu.Unlock()
	for _, id := range ids {
		if ib.count[id] == 0 {
			return false
		}
	}
	return true
}

// drain fetches, stores and acknowledges until the inbox has every one of
// msgs, or fails the test after d.
func drain(t *testing.T, s *Subscriber, ib *inbox, msgs []pgrelay.Message, d time.Duration) {
	t.Helper()
	want := make([]string, len(msgs))
	for i, m := range msgs {
		want[i] = m.EventID
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for !ib.has(want) {
		ds, err := s.Fetch(ctx, 100, 200*time.Millisecond)
		if ctx.Err() != nil {
			t.Fatalf("not every event arrived within %s", d)
		}
		if err != nil {
			t.Logf("fetch: %v", err)
			continue
		}
		for _, dv := range ds {
			ib.store(dv)
			if err := dv.Ack(ctx); err != nil {
				t.Fatalf("ack %s: %v", dv.Ref, err)
			}
		}
	}
}

// checkOrder fails unless every key's events arrived, each first delivered in
// publish order.
func checkOrder(t *testing.T, ib *inbox, msgs []pgrelay.Message) {
	t.Helper()
	want := map[string][]string{}
	for _, m := range msgs {
		want[m.Key] = append(want[m.Key], m.EventID)
	}
	for k, w := range want {
		if g := ib.order[k]; !slices.Equal(g, w) {
			t.Fatalf("key %q arrived as %v, want %v", k, g, w)
		}
	}
}

// failProduceRequest makes kfake answer the n-th produce request (counting
// from 1) with errCode on every partition, without storing anything, and
// lets every other produce request through.
func failProduceRequest(c *cluster, n int64, errCode int16) *atomic.Int64 {
	var seen atomic.Int64
	c.fake.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.fake.KeepControl()
		if seen.Add(1) != n {
			return nil, nil, false
		}
		preq := req.(*kmsg.ProduceRequest)
		resp := preq.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range preq.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = errCode
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	return &seen
}

// TestPublishBrokerErrorMidBatch: kfake fails one produce request in the
// middle of a batch with an error the producer does not retry. The events it
// carried, and every later event of their keys, are reported failed (none
// stored ahead of a failed one); published again as the relay does, every
// event arrives once, each key in order. A small MaxInFlight makes the
// publisher hand records over while the failure is known, so the test also
// covers "a key's later events are not sent after its failure".
func TestPublishBrokerErrorMidBatch(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.needFake(t, "it injects a produce error through kfake.ControlKey")
	ns := brokertest.Namespace("midbatch")
	c.createTopic(t, ns+".orders", testPartitions)
	cfg := c.config(t, ns)
	cfg.MaxInFlight = 8
	p := c.publisher(t, cfg)
	msgs := events(ns, []string{"a", "b", "c", "d", "e", "f"}, 40)

	seen := failProduceRequest(c, 4, kerr.UnknownServerError.Code)
	failures := publishAll(t, p, msgs)
	if seen.Load() < 4 || failures == 0 {
		t.Fatalf("the injected error did not hit a publish (%d produce requests, %d failures)", seen.Load(), failures)
	}
	t.Logf("%d produce requests, %d events failed and were published again", seen.Load(), failures)

	s := c.subscriber(t, withGroup(cfg, ns))
	ib := newInbox()
	drain(t, s, ib, msgs, 30*time.Second)
	checkOrder(t, ib, msgs)
	for id, n := range ib.count {
		if n != 1 {
			t.Fatalf("%s stored %d times in Kafka; a refused request must store nothing", id, n)
		}
	}
}

func withGroup(cfg Config, group string) Config {
	cfg.Group = group
	return cfg
}

// TestPublishRecoversFromProducerEpochBump: kfake answers one produce request
// mid-stream with INVALID_PRODUCER_EPOCH (what a fenced or expired producer
// sees). The producer takes a new producer id/epoch and sends again: no event
// is lost, duplicated or reordered.
func TestPublishRecoversFromProducerEpochBump(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.needFake(t, "it injects a fenced-epoch error through kfake.ControlKey")
	ns := brokertest.Namespace("epoch")
	c.createTopic(t, ns+".orders", testPartitions)
	cfg := c.config(t, ns)
	p := c.publisher(t, cfg)
	msgs := events(ns, []string{"a", "b", "c", "d"}, 50)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	publishAll(t, p, msgs[:20])
	id0, epoch0, err := p.Client().ProducerID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	seen := failProduceRequest(c, 2, kerr.InvalidProducerEpoch.Code)
	seen.Store(1) // the next produce request is the one refused
	publishAll(t, p, msgs[20:])
	id1, epoch1, err := p.Client().ProducerID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if id0 == id1 && epoch0 == epoch1 {
		t.Fatalf("producer id/epoch unchanged (%d/%d): the fault did not reach the producer", id1, epoch1)
	}
	t.Logf("producer %d/%d became %d/%d", id0, epoch0, id1, epoch1)

	s := c.subscriber(t, withGroup(cfg, ns))
	ib := newInbox()
	drain(t, s, ib, msgs, 30*time.Second)
	checkOrder(t, ib, msgs)
	for id, n := range ib.count {
		if n != 1 {
			t.Fatalf("%s stored %d times", id, n)
		}
	}
}

// partitionOf returns the partition in a Ref ("topic/3@17").
func partitionOf(ref string) int {
	slash, at := strings.LastIndexByte(ref, '/'), strings.LastIndexByte(ref, '@')
	n, _ := strconv.Atoi(ref[slash+1 : at])
	return n
}

// TestRebalanceRedeliversOnlyUnacked: a member receives a stream and
// acknowledges the first half of each partition's records, holding the rest;
// a second member joins the group and takes partitions over. Every record the
// first member held on a partition that moved reaches the new owner; no
// acknowledged record is delivered again; once everything is acknowledged, a
// third member receives nothing (every offset committed).
func TestRebalanceRedeliversOnlyUnacked(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	ns := brokertest.Namespace("rebalance")
	const partitions = 6
	c.createTopic(t, ns+".orders", partitions)
	cfg := c.config(t, ns)
	cfg.Group = ns
	// Offsets are committed only on revocation and close, so that the test
	// sees what the revocation commits.
	cfg.CommitInterval = time.Hour
	p := c.publisher(t, cfg)
	var keys []string
	for i := range 60 { // every partition gets keys
		keys = append(keys, fmt.Sprintf("k%d", i))
	}
	msgs := events(ns, keys, 5)
	publishAll(t, p, msgs)

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	a := c.subscriber(t, cfg)
	ib := newInbox()
	var got []broker.Delivery
	for !ib.has(idsOf(msgs)) {
		ds, err := a.Fetch(ctx, 100, 500*time.Millisecond)
		if ctx.Err() != nil {
			t.Fatal("A did not receive every record")
		}
		if err != nil {
			t.Logf("fetch: %v", err)
		}
		for _, d := range ds {
			ib.store(d)
		}
		got = append(got, ds...)
	}
	byPart := map[int][]broker.Delivery{}
	for _, d := range got {
		byPart[partitionOf(d.Ref)] = append(byPart[partitionOf(d.Ref)], d)
	}
	acked, held := map[string]bool{}, map[string]int{} // held: event id -> partition
	for part, ds := range byPart {
		for i, d := range ds {
			if i < len(ds)/2 {
				if err := d.Ack(ctx); err != nil {
					t.Fatal(err)
				}
				acked[d.Message.EventID] = true
			} else {
				held[d.Message.EventID] = part
			}
		}
	}

	// B joins and receives what it is given until every held record of
	// its partitions has come again.
	b := c.subscriber(t, cfg)
	redelivered := map[string]string{} // event id -> the member it came to again
	bParts := map[int]bool{}
	step := func(name string, s *Subscriber) {
		ds, _ := s.Fetch(ctx, 50, 200*time.Millisecond)
		for _, d := range ds {
			if ib.store(d) {
				redelivered[d.Message.EventID] = name
			}
			if name == "B" {
				bParts[partitionOf(d.Ref)] = true
			}
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	movedDone := func() bool {
		if len(bParts) == 0 {
			return false
		}
		for id, part := range held {
			if bParts[part] && redelivered[id] != "B" {
				return false
			}
		}
		return true
	}
	for !movedDone() {
		if ctx.Err() != nil {
			t.Fatalf("B did not receive the held records of its partitions %v", bParts)
		}
		step("B", b)
	}
	// A acknowledges what it held: committed for the partitions it kept,
	// nothing for those that moved.
	for _, d := range got {
		if _, ok := held[d.Message.EventID]; ok {
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	step("A", a)
	step("B", b)

	moved := 0
	for _, part := range held {
		if bParts[part] {
			moved++
		}
	}
	if moved == 0 {
		t.Fatalf("no held record was on a partition that moved to B (B has %v)", bParts)
	}
	for id, who := range redelivered {
		if acked[id] {
			t.Fatalf("%s was acknowledged before the rebalance and delivered again to %s", id, who)
		}
		if _, ok := held[id]; !ok {
			t.Fatalf("%s delivered twice but never held unacknowledged", id)
		}
	}
	t.Logf("A held %d unacknowledged records, %d on partitions %v that moved to B; %d redelivered",
		len(held), moved, bParts, len(redelivered))

	_ = a.Close()
	_ = b.Close()
	cs := c.subscriber(t, cfg)
	if ds, _ := cs.Fetch(ctx, 10, 5*time.Second); len(ds) > 0 {
		t.Fatalf("everything was acknowledged, yet a new member received %s", ds[0].Ref)
	}
}

func idsOf(msgs []pgrelay.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.EventID
	}
	return out
}

// TestCommitsOnlyContiguousPrefix: of one partition's records, acknowledging
// all but one commits only up to the gap: a new member receives the
// unacknowledged record and everything after it again, nothing before.
func TestCommitsOnlyContiguousPrefix(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	ns := brokertest.Namespace("prefix")
	c.createTopic(t, ns+".orders", 1)
	cfg := withGroup(c.config(t, ns), ns)
	p := c.publisher(t, cfg)
	msgs := events(ns, []string{"k"}, 10)
	publishAll(t, p, msgs)

	s1 := c.subscriber(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var got []broker.Delivery
	for len(got) < 10 && ctx.Err() == nil {
		ds, _ := s1.Fetch(ctx, 10, 500*time.Millisecond)
		got = append(got, ds...)
	}
	for i, d := range got {
		if i == 4 {
			continue // the gap
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := s1.Close(); err != nil {
		t.Fatal(err)
	}

	s2 := c.subscriber(t, cfg)
	var again []string
	deadline := time.Now().Add(10 * time.Second)
	for len(again) < 6 && time.Now().Before(deadline) {
		ds, _ := s2.Fetch(ctx, 10, 500*time.Millisecond)
		for _, d := range ds {
			again = append(again, d.Message.EventID)
		}
	}
	if want := idsOf(msgs[4:]); !slices.Equal(again, want) {
		t.Fatalf("after acknowledging all but the 5th, the next member received %v, want %v", again, want)
	}
}

// TestStandInIDStableAcrossRedelivery: a record without a usable event id is
// delivered dead under "kafka:<topic>:<partition>:<offset>", and under the
// same id when delivered again.
func TestStandInIDStableAcrossRedelivery(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	ns := brokertest.Namespace("standin")
	topic := ns + ".orders"
	c.createTopic(t, topic, 1)
	cfg := withGroup(c.config(t, ns), ns)
	raw, err := kgo.NewClient(kgo.SeedBrokers(c.brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := raw.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("no headers at all")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	first := fetchOne(t, c.subscriber(t, cfg))
	if want := FallbackEventID(topic, 0, 0); first.Message.EventID != want {
		t.Fatalf("stand-in id %q, want %q", first.Message.EventID, want)
	}
	if !strings.HasPrefix(first.DeadReason, broker.ReasonMissingEventID) {
		t.Fatalf("dead reason %q, want %q", first.DeadReason, broker.ReasonMissingEventID)
	}
	if err := event.ValidateEventID(first.Message.EventID); err != nil {
		t.Fatal(err)
	}
	// Not acknowledged: the next member of the group receives it again.
	second := fetchOne(t, c.subscriber(t, cfg))
	if second.Message.EventID != first.Message.EventID {
		t.Fatalf("redelivered under %q, first delivered under %q", second.Message.EventID, first.Message.EventID)
	}
}

// fetchOne fetches the first delivery and closes s.
func fetchOne(t *testing.T, s *Subscriber) broker.Delivery {
	t.Helper()
	defer func() { _ = s.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		ds, _ := s.Fetch(ctx, 1, 500*time.Millisecond)
		if len(ds) > 0 {
			return ds[0]
		}
	}
	t.Fatal("nothing delivered")
	return broker.Delivery{}
}

// TestConfigValidationNamesFields: bad settings fail at start-up naming the
// Config field.
func TestConfigValidationNamesFields(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "kafka.Config.Brokers"},
		{Config{Brokers: []string{"localhost"}}, "kafka.Config.Brokers"},
		{Config{Brokers: []string{"h:9092"}, TopicPrefix: "bad prefix"}, "kafka.Config.TopicPrefix"},
		{Config{Brokers: []string{"h:9092"}, Group: " g"}, "kafka.Config.Group"},
		{Config{Brokers: []string{"h:9092"}, MaxMessageBytes: 10}, "kafka.Config.MaxMessageBytes"},
		{Config{Brokers: []string{"h:9092"}, MaxInFlight: -1}, "kafka.Config.MaxInFlight"},
	} {
		err := tc.cfg.WithDefaults().Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: got %v, want an error naming %s", tc.cfg, err, tc.want)
		}
	}
	if err := (Config{Brokers: []string{"h:9092"}}).WithDefaults().Validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := NewPublisher(ctx, Config{Brokers: []string{"127.0.0.1:1"}, DialTimeout: time.Second})
	if err == nil || !strings.Contains(err.Error(), "kafka.Config.Brokers") {
		t.Errorf("unreachable broker: got %v, want an error naming kafka.Config.Brokers", err)
	}
}

// FuzzKafkaRoundTrip: the publisher's record mapping decoded by the subscriber.
func FuzzKafkaRoundTrip(f *testing.F) {
	brokertest.FuzzRoundTrip(f, func(t *testing.T, m pgrelay.Message) broker.Delivery {
		r := toRecord("pgrelay", m)
		r.Partition, r.Offset, r.Timestamp = 2, 7, time.Unix(1700000000, 0)
		return decodeRecord("pgrelay", r, broker.DecodeOptions{})
	})
}

// TestRefusesRetentionBeyondDedupWindow: a topic keeping records longer than
// the inbox's dedup window (Kafka's default retention.ms is 7 days) is refused
// at start-up, naming the settings, unless the replay risk is accepted.
func TestRefusesRetentionBeyondDedupWindow(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	ns := brokertest.Namespace("retention")
	c.createTopic(t, ns+".orders", 1)
	cfg := withGroup(c.config(t, ns), ns)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()

	cfg.DedupWindow = 24 * time.Hour
	if s, err := NewSubscriber(ctx, cfg); err == nil {
		_ = s.Close()
		t.Fatal("a topic keeping records 7 days was accepted with a 24h dedup window")
	} else if !strings.Contains(err.Error(), "kafka.Config.DedupWindow") || !strings.Contains(err.Error(), ns+".orders") {
		t.Fatalf("error %q should name the topic and kafka.Config.DedupWindow", err)
	}
	cfg.AllowReplayBeyondDedupWindow = true
	s, err := NewSubscriber(ctx, cfg)
	if err != nil {
		t.Fatalf("with the replay risk accepted: %v", err)
	}
	_ = s.Close()
	cfg.AllowReplayBeyondDedupWindow, cfg.DedupWindow = false, 30*24*time.Hour
	if s, err = NewSubscriber(ctx, cfg); err != nil {
		t.Fatalf("a 30-day dedup window covers 7 days of retention: %v", err)
	}
	_ = s.Close()
}

// TestPublisherRidesOutAShortCut: with its default settings the producer
// resends by itself through a cut connection (a second without a broker):
// every Publish succeeds, and each event is stored once, in order per key.
func TestPublisherRidesOutAShortCut(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	c.needFake(t, "it cuts the connection through a proxy in front of kfake")
	ns := brokertest.Namespace("ride")
	c.createTopic(t, ns+".orders", testPartitions)
	px := brokertest.StartProxy(t, c.brokers[0])
	addr := px.Listen
	cfg := c.config(t, ns)
	cfg.Dial = func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	p := c.publisher(t, cfg)
	msgs := events(ns, []string{"a", "b", "c"}, 60)
	var wg sync.WaitGroup
	wg.Go(func() {
		time.Sleep(100 * time.Millisecond)
		px.Stop()
		time.Sleep(time.Second)
		if err := px.Start(); err != nil {
			t.Errorf("proxy: %v", err)
		}
	})
	failures := 0
	for i := 0; i < len(msgs); i += 6 {
		failures += publishAll(t, p, msgs[i:i+6])
	}
	wg.Wait()
	if failures > 0 {
		t.Fatalf("%d publishes failed: the producer should have resent through the cut", failures)
	}
	s := c.subscriber(t, withGroup(c.config(t, ns), ns))
	ib := newInbox()
	drain(t, s, ib, msgs, 30*time.Second)
	checkOrder(t, ib, msgs)
	for id, n := range ib.count {
		if n != 1 {
			t.Fatalf("%s stored %d times: the producer's resends must be deduplicated", id, n)
		}
	}
}
