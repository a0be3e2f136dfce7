package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pgrelay/pgrelay/internal/ledger"
)

// faultRecord is one fault as it happened.
type faultRecord struct {
	At     time.Duration // since the run started
	Kind   string
	Detail string
}

// faultKindsFor returns the faults the schedule of a run on broker draws
// from; the broker's own are named after it ("nats-reset",
// "rabbitmq-reset"). restart includes "<broker>-restart".
func faultKindsFor(broker string, restart bool) []string {
	if broker == BrokerNATSCluster {
		// One node at a time, the stream leader or a follower; the
		// services stay up, so that what the run measures is the node loss.
		return []string{"node-kill-leader", "node-kill-follower"}
	}
	kinds := []string{
		"kill-relay", "kill-consumer",
		"pause-relay", "pause-consumer",
		"pg-latency", "pg-timeout", "pg-reset", "pg-partition",
		broker + "-latency", broker + "-timeout", broker + "-reset", broker + "-partition",
	}
	if restart {
		kinds = append(kinds, broker+"-restart")
	}
	return append(kinds, "pg-restart", "inject-duplicates", "inject-out-of-order", "inject-poison")
}

// faultPhase strikes faults one after another until the configured duration
// has passed. The first len(r.kinds) faults are a seeded permutation of
// every kind, so that even a short run sees each one; later ones are drawn
// at random.
func (r *run) faultPhase(ctx context.Context) error {
	rng := newRand(r.cfg.Seed, 1)
	end := time.Now().Add(r.cfg.Duration)
	order := rng.Perm(len(r.kinds))
	// Let the pipeline warm up before the first fault.
	if err := sleepCtx(ctx, 2*time.Second); err != nil {
		return err
	}
	for i := 0; time.Now().Before(end); i++ {
		kind := r.kinds[rng.IntN(len(r.kinds))]
		if i < len(order) {
			kind = r.kinds[order[i]]
		}
		at := time.Since(r.started)
		detail, err := r.strike(ctx, rng, kind)
		if err != nil {
			return fmt.Errorf("chaos: fault %s: %w", kind, err)
		}
		r.faults = append(r.faults, faultRecord{At: at, Kind: kind, Detail: detail})
		r.say("fault #%d %-19s %s", len(r.faults), kind, detail)
		if err := sleepCtx(ctx, time.Duration(200+rng.IntN(600))*time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

// strike applies one fault and, for the faults that last, ends it again.
func (r *run) strike(ctx context.Context, rng *rand.Rand, kind string) (string, error) {
	hold := func(min, spread time.Duration) time.Duration {
		return min + time.Duration(rng.Int64N(int64(spread)))
	}
	pick := func(s []*service) *service { return s[rng.IntN(len(s))] }
	// The broker's faults: "<broker>-latency" and so on.
	if b, f, ok := strings.Cut(kind, "-"); ok && b == r.cfg.Broker {
		kind = "broker-" + f
	}
	switch kind {
	case "kill-relay", "kill-consumer":
		s := pick(r.relay)
		if kind == "kill-consumer" {
			s = pick(r.cons)
		}
		s.scrape(ctx)
		s.proc.Kill()
		down := hold(0, time.Second)
		if err := sleepCtx(ctx, down); err != nil {
			return "", err
		}
		if err := s.start(); err != nil {
			return "", err
		}
		return fmt.Sprintf("SIGKILL %s, restarted after %s", s.name, down.Round(time.Millisecond)), nil

	case "pause-relay", "pause-consumer":
		s, lease := pick(r.relay), r.cfg.RelayLease
		if kind == "pause-consumer" {
			s, lease = pick(r.cons), r.cfg.ConsumerLease
		}
		s.scrape(ctx)
		d := lease + hold(500*time.Millisecond, time.Second)
		// A consumer is stopped while its database link is slow, so that it
		// is caught in the middle of a batch transaction, handler effects
		// done and the processed mark not yet committed: when it wakes up
		// its commit must be fenced.
		slow := kind == "pause-consumer"
		var removeLatency func()
		if slow {
			var err error
			if removeLatency, err = r.px.addToxic(r.px.pg, "latency", `{"latency":300}`); err != nil {
				return "", err
			}
			if err := sleepCtx(ctx, time.Second); err != nil {
				removeLatency()
				return "", err
			}
		}
		s.setPaused(true)
		err := s.proc.Signal(syscall.SIGSTOP)
		if slow {
			removeLatency()
		}
		if err != nil {
			s.setPaused(false)
			return "skipped: " + err.Error(), nil
		}
		err = sleepCtx(ctx, d)
		_ = s.proc.Signal(syscall.SIGCONT)
		s.setPaused(false)
		if err != nil {
			return "", err
		}
		what := ""
		if slow {
			what = " (stopped mid-transaction on a 300ms PostgreSQL link)"
		}
		return fmt.Sprintf("SIGSTOP %s%s for %s (lease %s), then SIGCONT: a zombie holding stale claims", s.name, what, d.Round(time.Millisecond), lease), nil

	case "pg-latency", "broker-latency", "pg-timeout", "broker-timeout", "pg-reset", "broker-reset", "pg-partition", "broker-partition":
		px, link := r.px.pg, "PostgreSQL"
		if strings.HasPrefix(kind, "broker") {
			px, link = r.px.broker, r.broker.label()
		}
		var toxic, attrs, what string
		d := hold(1500*time.Millisecond, 1500*time.Millisecond)
		switch kind[len(kind)-4:] {
		case "ency": // latency
			ms := 100 + rng.IntN(400)
			toxic, attrs, what = "latency", fmt.Sprintf(`{"latency":%d,"jitter":%d}`, ms, ms/4), fmt.Sprintf("%dms latency each way", ms)
		case "eout": // timeout
			ms := 500 + rng.IntN(1500)
			toxic, attrs, what = "timeout", fmt.Sprintf(`{"timeout":%d}`, ms), fmt.Sprintf("data stops, connections closed after %dms", ms)
		case "eset": // reset
			toxic, attrs, what = "reset_peer", `{"timeout":0}`, "every connection reset (TCP RST)"
			d = hold(500*time.Millisecond, time.Second)
		default: // partition
			toxic, attrs, what = "timeout", `{"timeout":0}`, "full partition: nothing gets through, connections hang"
			d = hold(2500*time.Millisecond, 2*time.Second)
		}
		remove, err := r.px.addToxic(px, toxic, attrs)
		if err != nil {
			return "", err
		}
		err = sleepCtx(ctx, d)
		remove()
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("%s link: %s for %s", link, what, d.Round(time.Millisecond)), nil

	case "broker-restart":
		down := hold(500*time.Millisecond, 2*time.Second)
		if err := r.broker.restart(ctx, down); err != nil {
			return "", err
		}
		return fmt.Sprintf("%s server shut down, restarted after %s", r.broker.label(), down.Round(time.Millisecond)), nil

	case "node-kill-leader", "node-kill-follower":
		env, ok := r.broker.(*natsClusterEnv)
		if !ok {
			return "", fmt.Errorf("chaos: %s needs a NATS cluster run", kind)
		}
		role := strings.TrimPrefix(kind, "node-kill-")
		detail, stall, err := env.killNode(ctx, rng, role == "leader", hold(500*time.Millisecond, 1500*time.Millisecond))
		if err != nil {
			return "", err
		}
		if r.stalls == nil {
			r.stalls = map[string][]time.Duration{}
		}
		r.stalls[role] = append(r.stalls[role], stall)
		return detail, nil

	case "pg-restart":
		mode := "fast"
		if rng.IntN(2) == 0 {
			mode = "immediate"
		}
		start := time.Now()
		if err := r.pg.restart(ctx, mode); err != nil {
			return "", err
		}
		return fmt.Sprintf("PostgreSQL stopped (-m %s) and restarted in %s", mode, time.Since(start).Round(time.Millisecond)), nil

	case "inject-duplicates":
		return r.injectDuplicates(ctx, rng)
	case "inject-out-of-order":
		return r.injectOutOfOrder(ctx, rng)
	case "inject-poison":
		return r.injectPoison(ctx)
	}
	return "", fmt.Errorf("unknown fault kind %q", kind)
}

// injectDuplicates republishes random stored messages straight to the
// broker under new broker ids, so that they reach the consumers: the inbox
// must absorb every copy.
func (r *run) injectDuplicates(ctx context.Context, rng *rand.Rand) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	detail, sent, err := r.broker.injectDuplicates(ctx, rng, r.cfg.Seed)
	if err != nil {
		return "", err
	}
	r.injected.addDuplicates(sent)
	return detail, nil
}

// injectOutOfOrder publishes OrderPaid events straight to NATS before their
// orders exist; the producer then creates the orders (through the outbox).
// Each payment must be credited once its order arrives.
func (r *run) injectOutOfOrder(ctx context.Context, rng *rand.Rand) (string, error) {
	n := 2 + rng.IntN(3)
	for i := range n {
		o := order{id: fmt.Sprintf("late%d-%d-%d", r.cfg.Seed, len(r.faults), i), customer: "late", amount: 100 + rng.Int64N(1000)}
		id := newEventID()
		if err := r.publishRaw(ctx, id, ledger.EventOrderPaid, o.id,
			mustJSON(ledger.OrderPaid{OrderID: o.id, AmountCents: o.amount, Currency: "EUR"})); err != nil {
			return "", err
		}
		r.injected.add(id, expectCredit)
		if !r.prod.retry(ctx, func() error { return r.prod.create(ctx, o, true, r.prod.pickWay(false)) }) {
			return "", fmt.Errorf("create late order %s", o.id)
		}
	}
	return fmt.Sprintf("%d OrderPaid published ahead of their OrderCreated", n), nil
}

// injectPoison publishes malformed events straight to NATS; each must end
// dead with its reason and stop nothing else.
func (r *run) injectPoison(ctx context.Context) (string, error) {
	bad := [][2]string{
		{ledger.EventOrderPaid, `{"order_id":"nobody","amount_cents":"lots","currency":"EUR"}`},
		{ledger.EventOrderCreated, `{"order_id": "x", oops`},
		{"OrderRefunded", `{"order_id":"x"}`},
	}
	for _, b := range bad {
		id := newEventID()
		if err := r.publishRaw(ctx, id, b[0], "poison-"+id, []byte(b[1])); err != nil {
			return "", err
		}
		r.injected.add(id, expectDead)
	}
	return fmt.Sprintf("%d malformed events (wrong JSON type, not JSON, unknown type)", len(bad)), nil
}

// publishRaw publishes one event straight to the broker with the relay's
// headers.
func (r *run) publishRaw(ctx context.Context, id, typ, key string, payload []byte) error {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	return r.broker.publishRaw(ctx, id, typ, key, payload)
}

func (r *run) faultCounts() map[string]int {
	m := map[string]int{}
	for _, f := range r.faults {
		m[f.Kind]++
	}
	return m
}

// expectation is what must become of an event injected straight into NATS.
type expectation int

const (
	expectCredit  expectation = iota // applied exactly once
	expectDead                       // dead with a reason
	expectExpired                    // an outbox event that expired unpublished: never received
)

// injections records what was published straight into NATS.
type injections struct {
	mu     sync.Mutex
	events map[string]expectation
	dups   int
}

func newInjections() *injections { return &injections{events: map[string]expectation{}} }

func (in *injections) add(id string, e expectation) {
	in.mu.Lock()
	in.events[id] = e
	in.mu.Unlock()
}

func (in *injections) addDuplicates(n int) {
	in.mu.Lock()
	in.dups += n
	in.mu.Unlock()
}

func (in *injections) duplicates() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.dups
}

func (in *injections) distinct() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return len(in.events)
}

func (in *injections) snapshot() map[string]expectation {
	in.mu.Lock()
	defer in.mu.Unlock()
	m := make(map[string]expectation, len(in.events))
	for k, v := range in.events {
		m[k] = v
	}
	return m
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func sortedKeys(m map[string]int) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
