package brokertest

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/internal/event"
)

// message returns the i-th test event of key.
func message(ns, key string, i int) pgrelay.Message {
	return pgrelay.Message{
		EventID:     fmt.Sprintf("%s-%s-%d", ns, key, i),
		Topic:       "orders",
		Key:         key,
		KeySeq:      int64(i + 1),
		EventType:   "OrderPaid",
		Payload:     fmt.Appendf(nil, `{"key":%q,"n":%d}`, key, i),
		ContentType: "application/json",
		Headers:     map[string]string{"Trace-Id": fmt.Sprintf("trace-%d", i)},
		OccurredAt:  time.Date(2026, 11, 23, 1, 2, 3, 456789000, time.UTC).Add(time.Duration(i) * time.Second),
	}
}

func messages(ns, key string, n int) []pgrelay.Message {
	out := make([]pgrelay.Message, n)
	for i := range out {
		out[i] = message(ns, key, i)
	}
	return out
}

// publishOK publishes msgs and fails the test unless every one is confirmed.
func publishOK(t *testing.T, p broker.Publisher, msgs []pgrelay.Message) []broker.Result {
	t.Helper()
	res := p.Publish(timeout(t, 30*time.Second), msgs)
	if len(res) != len(msgs) {
		t.Fatalf("Publish returned %d results for %d messages", len(res), len(msgs))
	}
	for i, r := range res {
		if r.Err != nil {
			t.Fatalf("publish %s: %v", msgs[i].EventID, r.Err)
		}
	}
	return res
}

// fetchUntil fetches (without acknowledging) until done reports true for
// the deliveries so far, or d passes; fetch errors are retried. It returns
// every delivery received, redeliveries included, in order.
func fetchUntil(t *testing.T, s broker.Subscriber, d time.Duration, done func([]broker.Delivery) bool) []broker.Delivery {
	t.Helper()
	ctx := timeout(t, d+10*time.Second)
	end := time.Now().Add(d)
	var got []broker.Delivery
	for !done(got) && time.Now().Before(end) {
		ds, err := s.Fetch(ctx, 50, 500*time.Millisecond)
		if err != nil {
			t.Logf("fetch: %v (retrying)", err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		for _, dv := range ds {
			checkDelivery(t, dv)
		}
		got = append(got, ds...)
	}
	return got
}

// checkDelivery checks what every delivery must be: storable and
// acknowledgeable.
func checkDelivery(t *testing.T, d broker.Delivery) {
	t.Helper()
	if err := event.ValidateEventID(d.Message.EventID); err != nil {
		t.Fatalf("delivery %s: event id %q: %v", d.Ref, d.Message.EventID, err)
	}
	if d.Ref == "" {
		t.Fatalf("delivery %s has no Ref", d.Message.EventID)
	}
	if d.Ack == nil || d.InProgress == nil {
		t.Fatalf("delivery %s: Ack and InProgress must be set", d.Ref)
	}
}

// distinctIDs returns the event ids of ds, first occurrences only, in order.
func distinctIDs(ds []broker.Delivery) []string {
	seen := map[string]bool{}
	var ids []string
	for _, d := range ds {
		if !seen[d.Message.EventID] {
			seen[d.Message.EventID] = true
			ids = append(ids, d.Message.EventID)
		}
	}
	return ids
}

func ids(msgs []pgrelay.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.EventID
	}
	return out
}

func haveAll(want []string) func([]broker.Delivery) bool {
	return func(ds []broker.Delivery) bool {
		got := map[string]bool{}
		for _, d := range ds {
			got[d.Message.EventID] = true
		}
		for _, id := range want {
			if !got[id] {
				return false
			}
		}
		return true
	}
}

func ackAll(t *testing.T, ds []broker.Delivery) {
	t.Helper()
	ctx := timeout(t, 10*time.Second)
	for _, d := range ds {
		if err := d.Ack(ctx); err != nil {
			t.Fatalf("ack %s: %v", d.Ref, err)
		}
	}
}

func newPair(t *testing.T, h Harness, ns, consumer string) (broker.Publisher, broker.Subscriber) {
	t.Helper()
	p := h.NewPublisher(t, ns)
	t.Cleanup(func() { _ = p.Close() })
	s := h.subscriber(t, ns, consumer)
	t.Cleanup(func() { _ = s.Close() })
	return p, s
}

// sameMessage fails unless got is want as received: every field pgrelay
// carries, compared exactly (the occurred-at as an instant).
func sameMessage(t *testing.T, want, got pgrelay.Message) {
	t.Helper()
	switch {
	case got.EventID != want.EventID:
		t.Fatalf("event id %q, want %q", got.EventID, want.EventID)
	case got.Topic != want.Topic || got.Key != want.Key || got.EventType != want.EventType:
		t.Fatalf("%s: topic/key/type %q/%q/%q, want %q/%q/%q", want.EventID,
			got.Topic, got.Key, got.EventType, want.Topic, want.Key, want.EventType)
	case !bytes.Equal(got.Payload, want.Payload):
		t.Fatalf("%s: payload %q, want %q", want.EventID, got.Payload, want.Payload)
	case got.KeySeq != want.KeySeq:
		t.Fatalf("%s: key sequence %d, want %d", want.EventID, got.KeySeq, want.KeySeq)
	case got.ContentType != want.ContentType:
		t.Fatalf("%s: content type %q, want %q", want.EventID, got.ContentType, want.ContentType)
	case !got.OccurredAt.Equal(wantAt(want.OccurredAt)):
		t.Fatalf("%s: occurred at %s, want %s", want.EventID, got.OccurredAt, wantAt(want.OccurredAt))
	case got.TraceParent != want.TraceParent || got.TraceState != want.TraceState:
		t.Fatalf("%s: trace context %q/%q, want %q/%q", want.EventID, got.TraceParent, got.TraceState, want.TraceParent, want.TraceState)
	case !maps.Equal(got.Headers, want.Headers) && !(len(got.Headers) == 0 && len(want.Headers) == 0):
		t.Fatalf("%s: headers %v, want %v", want.EventID, got.Headers, want.Headers)
	}
}

// wantAt is an occurred-at as the inbox keeps it (to the microsecond).
func wantAt(at time.Time) time.Time {
	n, err := event.NormalizeOccurredAt(at)
	if err != nil {
		return at
	}
	return n
}

// testPublishAndConfirm: every published message is confirmed, arrives
// decoded as it was sent, in publish order for its key, and once acked is
// not delivered again.
func testPublishAndConfirm(t *testing.T, h Harness) {
	ns := Namespace("pub")
	p, s := newPair(t, h, ns, "c")
	msgs := messages(ns, "k", 20)
	for _, r := range publishOK(t, p, msgs) {
		if r.Duplicate {
			t.Fatal("a first publish was reported as a duplicate")
		}
	}
	got := fetchUntil(t, s, h.RedeliveryTimeout, haveAll(ids(msgs)))
	if !slices.Equal(distinctIDs(got), ids(msgs)) {
		t.Fatalf("received %v, want %v in order", distinctIDs(got), ids(msgs))
	}
	for i, d := range got[:len(msgs)] {
		if d.DeadReason != "" {
			t.Fatalf("%s: dead: %s", d.Ref, d.DeadReason)
		}
		sameMessage(t, msgs[i], d.Message)
	}
	ackAll(t, got)
	if again := fetchUntil(t, s, 2*time.Second, func([]broker.Delivery) bool { return false }); len(again) > 0 {
		t.Fatalf("acknowledged deliveries came again: %v", distinctIDs(again))
	}
}

// testRoundTrip: unusual but valid events arrive unchanged.
func testRoundTrip(t *testing.T, h Harness) {
	ns := Namespace("rt")
	p, s := newPair(t, h, ns, "c")
	odd := []pgrelay.Message{
		{EventID: ns + "-binary", Topic: "orders", Key: "", EventType: "Blob", Payload: []byte{0, 1, 0xff, 0xfe},
			ContentType: "application/octet-stream", OccurredAt: time.Unix(0, 1000).UTC()},
		{EventID: ns + "-unicode-éü", Topic: "orders", Key: "clé ключ", EventType: "Événement", Payload: []byte(`"ß"`),
			Headers:    map[string]string{"Mixed-Case": "välue", event.HeaderCausationID: "cause-1", event.HeaderCorrelationID: "corr-1"},
			OccurredAt: time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC),
			// The W3C trace context travels as the traceparent and
			// tracestate headers.
			TraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", TraceState: "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"},
		{EventID: ns + "-empty", Topic: "orders", Key: "k", EventType: "Empty", Payload: nil,
			OccurredAt: time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)},
	}
	publishOK(t, p, odd)
	got := fetchUntil(t, s, h.RedeliveryTimeout, haveAll(ids(odd)))
	byID := map[string]broker.Delivery{}
	for _, d := range got {
		byID[d.Message.EventID] = d
	}
	for _, m := range odd {
		d, ok := byID[m.EventID]
		if !ok {
			t.Fatalf("%s not received", m.EventID)
		}
		if d.DeadReason != "" {
			t.Fatalf("%s: dead: %s", d.Ref, d.DeadReason)
		}
		sameMessage(t, m, d.Message)
	}
	ackAll(t, got)
}

// testDedupIDCarried: the delivery's event id is the published one, on every
// delivery; a republished event is reported as a duplicate where the broker
// deduplicates, and then not delivered twice.
func testDedupIDCarried(t *testing.T, h Harness) {
	ns := Namespace("dup")
	p, s := newPair(t, h, ns, "c")
	msgs := messages(ns, "k", 5)
	publishOK(t, p, msgs)
	res := publishOK(t, p, msgs[:2])
	if h.ReportsDuplicates {
		for i, r := range res {
			if !r.Duplicate {
				t.Fatalf("republished %s not reported as a duplicate", msgs[i].EventID)
			}
		}
	}
	// Each delivery is acknowledged as soon as it arrives, so that anything
	// seen twice was delivered twice, not redelivered.
	var got []broker.Delivery
	ctx := timeout(t, h.RedeliveryTimeout+10*time.Second)
	fetchAcking := func(d time.Duration, done func([]broker.Delivery) bool) {
		for end := time.Now().Add(d); !done(got) && time.Now().Before(end); {
			ds, err := s.Fetch(ctx, 50, 200*time.Millisecond)
			if err != nil {
				t.Logf("fetch: %v (retrying)", err)
				continue
			}
			for _, d := range ds {
				checkDelivery(t, d)
				if err := d.Ack(ctx); err != nil {
					t.Fatalf("ack %s: %v", d.Ref, err)
				}
			}
			got = append(got, ds...)
		}
	}
	fetchAcking(h.RedeliveryTimeout, haveAll(ids(msgs)))
	fetchAcking(time.Second, func([]broker.Delivery) bool { return false })
	want := map[string]bool{}
	for _, m := range msgs {
		want[m.EventID] = true
	}
	count := map[string]int{}
	for _, d := range got {
		if !want[d.Message.EventID] {
			t.Fatalf("delivery %s carries event id %q, not a published one", d.Ref, d.Message.EventID)
		}
		count[d.Message.EventID]++
	}
	if len(count) != len(msgs) {
		t.Fatalf("received %v, want %v", distinctIDs(got), ids(msgs))
	}
	if h.ReportsDuplicates {
		for id, n := range count {
			if n != 1 {
				t.Fatalf("%s delivered %d times although the broker deduplicates", id, n)
			}
		}
	}
}

// testPermanentErrors: a message too large and a missing destination fail
// permanently (the relay dead-letters them), without stopping other keys.
func testPermanentErrors(t *testing.T, h Harness) {
	if h.MaxMessageBytes <= 0 && h.UnknownDestination == nil {
		t.Skip("the harness gives neither MaxMessageBytes nor UnknownDestination")
	}
	ns := Namespace("perm")
	if h.MaxMessageBytes > 0 {
		p, s := newPair(t, h, ns, "c")
		big := message(ns, "big", 0)
		big.Payload = bytes.Repeat([]byte("x"), h.MaxMessageBytes+1)
		big.ContentType = "text/plain"
		small := message(ns, "small", 0)
		res := p.Publish(timeout(t, 30*time.Second), []pgrelay.Message{big, small})
		if !broker.IsTerminal(res[0].Err) {
			t.Fatalf("a message over MaxMessageBytes: got %v, want a permanent error", res[0].Err)
		}
		if res[1].Err != nil {
			t.Fatalf("another key's message failed with the large one: %v", res[1].Err)
		}
		got := fetchUntil(t, s, h.RedeliveryTimeout, haveAll([]string{small.EventID}))
		for _, d := range got {
			if d.Message.EventID == big.EventID {
				t.Fatal("the refused message was delivered")
			}
		}
		ackAll(t, got)
	}
	if h.UnknownDestination != nil {
		p := h.UnknownDestination(t, ns+"_missing")
		t.Cleanup(func() { _ = p.Close() })
		res := p.Publish(timeout(t, 30*time.Second), []pgrelay.Message{message(ns, "k", 1)})
		if !broker.IsTerminal(res[0].Err) {
			t.Fatalf("publishing to a missing destination: got %v, want a permanent error", res[0].Err)
		}
	}
}

// testUnackedRedelivered: deliveries a closed subscriber never acknowledged
// reach the next subscriber of the same consumer, with the same event ids.
func testUnackedRedelivered(t *testing.T, h Harness) {
	if h.NewSubscriber == nil {
		t.Skip("the adapter stores into the inbox: Publish's commit is the acknowledgement, and nothing is redelivered")
	}
	ns := Namespace("redeliver")
	p := h.NewPublisher(t, ns)
	t.Cleanup(func() { _ = p.Close() })
	msgs := messages(ns, "k", 5)
	publishOK(t, p, msgs)
	s1 := h.NewSubscriber(t, ns, "c")
	first := fetchUntil(t, s1, h.RedeliveryTimeout, haveAll(ids(msgs)))
	if !haveAll(ids(msgs))(first) {
		t.Fatalf("first subscriber received %v, want %v", distinctIDs(first), ids(msgs))
	}
	if err := s1.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	s2 := h.NewSubscriber(t, ns, "c")
	t.Cleanup(func() { _ = s2.Close() })
	again := fetchUntil(t, s2, h.RedeliveryTimeout, haveAll(ids(msgs)))
	if !haveAll(ids(msgs))(again) {
		t.Fatalf("unacknowledged deliveries not redelivered: got %v, want %v", distinctIDs(again), ids(msgs))
	}
	// A redelivery is never a first delivery: the consumer applies only
	// first deliveries on receive, so a message that killed it there is
	// next run by a claim that counts the attempt.
	for _, d := range again {
		if d.FirstDelivery {
			t.Fatalf("redelivered %s (%s) says FirstDelivery", d.Message.EventID, d.Ref)
		}
	}
	ackAll(t, again)
}

// testAckOnlyWhenTold: of a fetched batch, only what the caller acknowledged
// counts as consumed: after a close, exactly the others come again. Fetch
// itself acknowledges nothing.
func testAckOnlyWhenTold(t *testing.T, h Harness) {
	if h.NewSubscriber == nil {
		t.Skip("the adapter stores into the inbox: Publish's commit is the acknowledgement, and nothing is redelivered")
	}
	ns := Namespace("ack")
	p := h.NewPublisher(t, ns)
	t.Cleanup(func() { _ = p.Close() })
	msgs := messages(ns, "k", 10)
	publishOK(t, p, msgs)
	s1 := h.NewSubscriber(t, ns, "c")
	first := fetchUntil(t, s1, h.RedeliveryTimeout, haveAll(ids(msgs)))
	if !slices.Equal(distinctIDs(first), ids(msgs)) {
		t.Fatalf("received %v, want %v", distinctIDs(first), ids(msgs))
	}
	// Acknowledge the first half, in order (Kafka commits offsets).
	acked := map[string]bool{}
	ackAll(t, first[:5])
	for _, d := range first[:5] {
		acked[d.Message.EventID] = true
	}
	if err := s1.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	rest := ids(msgs[5:])
	s2 := h.NewSubscriber(t, ns, "c")
	t.Cleanup(func() { _ = s2.Close() })
	again := fetchUntil(t, s2, h.RedeliveryTimeout, haveAll(rest))
	// Anything acknowledged that was going to come back comes with the rest
	// or just after.
	again = append(again, fetchUntil(t, s2, 2*time.Second, func([]broker.Delivery) bool { return false })...)
	if !haveAll(rest)(again) {
		t.Fatalf("unacknowledged deliveries not redelivered: got %v, want %v", distinctIDs(again), rest)
	}
	for _, d := range again {
		if acked[d.Message.EventID] {
			t.Fatalf("%s was acknowledged and came again (%s)", d.Message.EventID, d.Ref)
		}
	}
	ackAll(t, again)
}

// testStandInIDStable: a message without any event id is delivered dead
// (missing event id) under a valid stand-in id, and its redelivery to
// another subscriber carries the same id, so that the inbox stores it once.
func testStandInIDStable(t *testing.T, h Harness) {
	if h.PublishWithoutID == nil {
		t.Skip("the harness has no PublishWithoutID capability")
	}
	ns := Namespace("noid")
	p := h.NewPublisher(t, ns) // sets up the namespace
	t.Cleanup(func() { _ = p.Close() })
	h.PublishWithoutID(t, ns, []byte(`{"first":true}`))
	h.PublishWithoutID(t, ns, []byte(`{"second":true}`))
	two := func(ds []broker.Delivery) bool { return len(distinctIDs(ds)) >= 2 }
	s1 := h.NewSubscriber(t, ns, "c")
	first := fetchUntil(t, s1, h.RedeliveryTimeout, two)
	if !two(first) {
		t.Fatalf("received %d deliveries with ids %v, want 2 messages", len(first), distinctIDs(first))
	}
	byPayload := map[string]string{}
	for _, d := range first {
		if !strings.HasPrefix(d.DeadReason, broker.ReasonMissingEventID) {
			t.Fatalf("%s: dead reason %q, want %q", d.Ref, d.DeadReason, broker.ReasonMissingEventID)
		}
		byPayload[string(d.Message.Payload)] = d.Message.EventID
	}
	if byPayload[`{"first":true}`] == byPayload[`{"second":true}`] {
		t.Fatalf("two messages share the stand-in id %q", byPayload[`{"first":true}`])
	}
	if err := s1.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	s2 := h.NewSubscriber(t, ns, "c")
	t.Cleanup(func() { _ = s2.Close() })
	again := fetchUntil(t, s2, h.RedeliveryTimeout, two)
	if !two(again) {
		t.Fatalf("not redelivered: got %v", distinctIDs(again))
	}
	for _, d := range again {
		if want := byPayload[string(d.Message.Payload)]; d.Message.EventID != want {
			t.Fatalf("redelivery %s has stand-in id %q, the first delivery had %q", d.Ref, d.Message.EventID, want)
		}
	}
	ackAll(t, again)
}
