// Package brokertest is the conformance suite every broker adapter passes:
// Run drives an adapter's Publisher and Subscriber against its real broker
// and checks the properties pgrelay relies on (confirmed publishes, the event
// id carried as the dedup id, per-key order across a transient failure,
// permanent-error classification, redelivery of what was not acknowledged,
// acknowledgement only when the caller says so, stable stand-in ids,
// reconnection). FuzzRoundTrip checks an adapter's encode → decode mapping
// without a broker.
//
// An adapter runs it from a test of its own package with a Harness over its
// real broker; broker/nats/conformance_test.go is the NATS one
// (TestNATSConformance, FuzzNATSRoundTrip).
package brokertest

import (
	"context"
	"fmt"
	"io"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/pgrelay/pgrelay/broker"
)

// Harness gives the suite an adapter. NewPublisher and NewSubscriber (or
// Stored) are required; every other field is a capability the suite uses when it is set
// and skips the sub-tests that need it (naming why) when it is not.
type Harness struct {
	// NewPublisher returns a publisher whose messages land in namespace ns
	// (a fresh stream, topic prefix or exchange per call of the suite): the
	// harness creates whatever ns needs so that NewSubscriber(t, ns, ...)
	// receives every topic published in it. The suite closes it.
	NewPublisher func(t *testing.T, ns string) broker.Publisher
	// NewSubscriber returns a subscriber for the named consumer (durable,
	// group, queue) of namespace ns. Two subscribers of the same ns and
	// consumer share the work and its acknowledgements; a subscriber created
	// after another was closed receives what that one left unacknowledged.
	// Its redelivery delay (ack wait) should be short, a few seconds at most.
	// The suite closes it.
	// Either NewSubscriber or Stored is required.
	NewSubscriber func(t *testing.T, ns, consumer string) broker.Subscriber
	// Stored, set instead of NewSubscriber, is for an adapter without a
	// subscriber, whose Publish stores each batch straight into the
	// consumer's inbox in one transaction (broker/postgres): it returns
	// what namespace ns holds so far, one delivery per stored row, each
	// with a Ref naming its row. The suite reads what was stored instead of
	// fetching; storing is the acknowledgement (Publish returns once the
	// transaction committed), so the sub-tests of acknowledgement and
	// redelivery (UnackedRedelivered, AckOnlyWhenTold, StandInIDStable)
	// are skipped.
	Stored func(t *testing.T, ns string) []broker.Delivery

	// Proxied, when set, returns a harness whose publishers and subscribers
	// reach the broker through the returned in-process toxiproxy proxy (see
	// StartProxy), so that the suite can cut their connections.
	Proxied func(t *testing.T) (Harness, *toxiproxy.Proxy)
	// Restartable, when set, returns a harness on a private broker and a
	// function that restarts that broker (stops it and starts it again at the
	// same address with the same storage), returning once it accepts
	// connections again.
	Restartable func(t *testing.T) (Harness, func(t *testing.T))
	// UnknownDestination, when set, returns a publisher of namespace ns whose
	// destination does not exist (no stream stores its subjects, the topic or
	// exchange is missing): every publish must fail permanently.
	UnknownDestination func(t *testing.T, ns string) broker.Publisher
	// PublishWithoutID, when set, publishes payload into namespace ns (topic
	// "orders") the way a foreign producer would, with no event id at all
	// (no pgrelay header, no broker message id): the subscriber must give it
	// a stand-in id from its broker position, the same on every redelivery.
	PublishWithoutID func(t *testing.T, ns string, payload []byte)
	// MaxMessageBytes, when positive, is a payload size the broker refuses
	// in the harness's namespaces: a larger message must fail permanently.
	MaxMessageBytes int
	// ReportsDuplicates says that the broker deduplicates on the event id
	// and reports a republished event as Result.Duplicate (JetStream's
	// duplicate window).
	ReportsDuplicates bool
	// AckTimeout, when positive, is how long the adapter's publisher waits
	// for one acknowledgement before the publish fails transiently: the
	// per-key order test then also holds acknowledgements back past it.
	AckTimeout time.Duration
	// RedeliveryTimeout bounds the wait for a redelivery. Default 30s.
	RedeliveryTimeout time.Duration
}

var nsSeq atomic.Int64

// Namespace returns a fresh namespace name: letters, digits and '_' only,
// unique within the process and across runs.
func Namespace(prefix string) string {
	return fmt.Sprintf("%s_%d_%d", prefix, time.Now().UnixNano()%1e12, nsSeq.Add(1))
}

// StartProxy starts an in-process toxiproxy proxy on a free local port in
// front of upstream (host:port) and stops it when the test ends. Connect to
// proxy.Listen. Stopping and starting the proxy again cuts every connection
// through it and listens on the same address.
func StartProxy(t *testing.T, upstream string) *toxiproxy.Proxy {
	t.Helper()
	api := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.New(io.Discard))
	px := toxiproxy.NewProxy(api, "broker", "127.0.0.1:0", upstream)
	if err := px.Start(); err != nil {
		t.Fatalf("brokertest: proxy to %s: %v", upstream, err)
	}
	t.Cleanup(px.Stop)
	return px
}

// Run runs the conformance suite against h.
func Run(t *testing.T, h Harness) {
	if h.NewPublisher == nil || (h.NewSubscriber == nil) == (h.Stored == nil) {
		t.Fatal("brokertest: Harness.NewPublisher and one of Harness.NewSubscriber and Harness.Stored are required")
	}
	if h.RedeliveryTimeout == 0 {
		h.RedeliveryTimeout = 30 * time.Second
	}
	t.Run("PublishAndConfirm", func(t *testing.T) { t.Parallel(); testPublishAndConfirm(t, h) })
	t.Run("RoundTrip", func(t *testing.T) { t.Parallel(); testRoundTrip(t, h) })
	t.Run("DedupIDCarried", func(t *testing.T) { t.Parallel(); testDedupIDCarried(t, h) })
	t.Run("PermanentErrors", func(t *testing.T) { t.Parallel(); testPermanentErrors(t, h) })
	t.Run("UnackedRedelivered", func(t *testing.T) { t.Parallel(); testUnackedRedelivered(t, h) })
	t.Run("AckOnlyWhenTold", func(t *testing.T) { t.Parallel(); testAckOnlyWhenTold(t, h) })
	t.Run("StandInIDStable", func(t *testing.T) { t.Parallel(); testStandInIDStable(t, h) })
	t.Run("PerKeyOrderAcrossTransientFailure", func(t *testing.T) { testPerKeyOrder(t, h) })
	t.Run("ReconnectAfterConnectionCut", func(t *testing.T) { testReconnectAfterCut(t, h) })
	t.Run("ReconnectAfterRestart", func(t *testing.T) { testReconnectAfterRestart(t, h) })
}

func timeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// subscriber returns h's subscriber for consumer of ns, or, for a harness
// with Stored, a reader of what ns holds.
func (h Harness) subscriber(t *testing.T, ns, consumer string) broker.Subscriber {
	if h.NewSubscriber != nil {
		return h.NewSubscriber(t, ns, consumer)
	}
	return &storedReader{t: t, ns: ns, stored: h.Stored, seen: map[string]bool{}}
}

// storedReader fetches the rows Harness.Stored lists, each once.
type storedReader struct {
	t      *testing.T
	ns     string
	stored func(t *testing.T, ns string) []broker.Delivery
	seen   map[string]bool
}

func (r *storedReader) Fetch(ctx context.Context, max int, maxWait time.Duration) ([]broker.Delivery, error) {
	end := time.Now().Add(maxWait)
	for {
		var out []broker.Delivery
		for _, d := range r.stored(r.t, r.ns) {
			if len(out) < max && !r.seen[d.Ref] {
				r.seen[d.Ref] = true
				d.Ack = func(context.Context) error { return nil }
				d.InProgress = d.Ack
				out = append(out, d)
			}
		}
		if len(out) > 0 || time.Now().After(end) {
			return out, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (r *storedReader) Close() error { return nil }
