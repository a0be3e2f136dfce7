package rounds

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
)

// fake is a broker whose outcomes are given per event id. It records the
// order messages were started and how many were in flight at most, and
// refuses to start a key's message while an earlier one of that key is in
// flight.
type fake struct {
	t         *testing.T
	msgs      []pgrelay.Message
	outcome   map[string]error
	window    int // messages in flight at most; 0: no bound
	inFlight  map[int]bool
	keyBusy   map[string]bool
	started   []string
	maxFlight int
}

func (f *fake) send(i int, mayBlock bool) Await {
	m := f.msgs[i]
	if f.window > 0 && len(f.inFlight) >= f.window {
		if mayBlock {
			f.t.Fatalf("asked to block for room with %d of this round in flight: it would never come", len(f.inFlight))
		}
		return nil
	}
	if f.keyBusy[m.Key] {
		f.t.Fatalf("%s started while an earlier event of key %s is in flight", m.EventID, m.Key)
	}
	f.keyBusy[m.Key] = true
	f.inFlight[i] = true
	f.maxFlight = max(f.maxFlight, len(f.inFlight))
	f.started = append(f.started, m.EventID)
	return func() broker.Result {
		delete(f.inFlight, i)
		f.keyBusy[m.Key] = false
		return broker.Result{Err: f.outcome[m.EventID]}
	}
}

func run(t *testing.T, window int, events string, outcome map[string]error) (*fake, []broker.Result) {
	t.Helper()
	f := &fake{t: t, outcome: outcome, window: window, inFlight: map[int]bool{}, keyBusy: map[string]bool{}}
	for _, e := range strings.Fields(events) {
		f.msgs = append(f.msgs, pgrelay.Message{EventID: e, Key: e[:1]})
	}
	return f, Publish(f.msgs, f.send)
}

func TestKeysInFlightTogetherEachInOrder(t *testing.T) {
	f, res := run(t, 0, "a1 b1 a2 c1 a3 b2", nil)
	for i, r := range res {
		if r.Err != nil {
			t.Fatalf("%s: %v", f.msgs[i].EventID, r.Err)
		}
	}
	if got, want := strings.Join(f.started, " "), "a1 b1 c1 a2 b2 a3"; got != want {
		t.Fatalf("started %q, want %q (one message per key per round, each key in order)", got, want)
	}
	if f.maxFlight != 3 {
		t.Fatalf("at most %d in flight, want the 3 keys together", f.maxFlight)
	}
}

func TestTransientFailureStopsItsKeyOnly(t *testing.T) {
	lost := errors.New("connection lost")
	f, res := run(t, 0, "a1 a2 a3 b1 b2", map[string]error{"a2": lost})
	if got, want := strings.Join(f.started, " "), "a1 b1 a2 b2"; got != want {
		t.Fatalf("started %q, want %q: nothing of key a after a2 failed", got, want)
	}
	want := []string{"<nil>", "connection lost", `not sent: an earlier event of key "a" failed: connection lost`, "<nil>", "<nil>"}
	for i, r := range res {
		if got := fmt.Sprint(r.Err); got != want[i] {
			t.Errorf("%s: %s, want %s", f.msgs[i].EventID, got, want[i])
		}
	}
	if !errors.Is(res[2].Err, lost) {
		t.Error("the not-sent outcome does not wrap the failure")
	}
}

func TestPermanentFailureLetsItsKeyGoOn(t *testing.T) {
	tooLarge := broker.Terminalf("too large")
	f, res := run(t, 0, "a1 a2 a3", map[string]error{"a2": tooLarge})
	if got, want := strings.Join(f.started, " "), "a1 a2 a3"; got != want {
		t.Fatalf("started %q, want %q", got, want)
	}
	if res[0].Err != nil || !broker.IsTerminal(res[1].Err) || res[2].Err != nil {
		t.Fatalf("outcomes %v, want nil, permanent, nil", res)
	}
}

func TestFullWindowEndsTheRound(t *testing.T) {
	f, res := run(t, 2, "a1 b1 c1 d1 e1 a2", nil)
	for i, r := range res {
		if r.Err != nil {
			t.Fatalf("%s: %v", f.msgs[i].EventID, r.Err)
		}
	}
	if f.maxFlight != 2 {
		t.Fatalf("at most %d in flight, want the window's 2", f.maxFlight)
	}
	if len(f.started) != 6 {
		t.Fatalf("started %v, want all 6", f.started)
	}
	for i, e := range f.started {
		if e == "a2" && i < 2 {
			t.Fatalf("a2 started in the first round: %v", f.started)
		}
	}
}

func TestTakeEndsTheRoundOrWaits(t *testing.T) {
	slots := make(chan struct{}, 1)
	if took, err := Take(context.Background(), slots, false); !took || err != nil {
		t.Fatalf("a free slot: took %v, %v", took, err)
	}
	if took, err := Take(context.Background(), slots, false); took || err != nil {
		t.Fatalf("no free slot, may not block: took %v, %v; want no slot and no error (the next round)", took, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if took, err := Take(ctx, slots, true); took || !errors.Is(err, context.Canceled) {
		t.Fatalf("no free slot, may block, ctx done: took %v, %v", took, err)
	}
	<-slots
	if took, err := Take(context.Background(), slots, true); !took || err != nil {
		t.Fatalf("a slot freed: took %v, %v", took, err)
	}
}
