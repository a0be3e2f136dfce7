package nats_test

import (
	"context"
	"net"
	"net/url"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/brokertest"
	pgnats "github.com/pgrelay/pgrelay/broker/nats"
	"github.com/pgrelay/pgrelay/internal/event"
	"github.com/pgrelay/pgrelay/internal/testnats"
)

// natsMaxMsgBytes is the MaxMsgSize of the conformance suite's streams.
const natsMaxMsgBytes = 4096

// natsHarness is the conformance harness of the NATS adapter on the server
// at url: each namespace is a stream of its own over the subjects "<ns>.>".
func natsHarness(t *testing.T, url string) brokertest.Harness {
	_, js := testnats.Connect(t, url)
	publisher := func(t *testing.T, ns, stream string) broker.Publisher {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		p, err := pgnats.NewPublisher(ctx, pgnats.Config{URL: url, Stream: stream, SubjectPrefix: ns,
			AckTimeout: 2 * time.Second, ReconnectWait: 100 * time.Millisecond})
		if err != nil {
			t.Fatalf("NewNATS: %v", err)
		}
		return p
	}
	return brokertest.Harness{
		NewPublisher: func(t *testing.T, ns string) broker.Publisher {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: ns, Subjects: []string{ns + ".>"},
				Storage: jetstream.FileStorage, MaxAge: time.Hour, MaxMsgSize: natsMaxMsgBytes})
			if err != nil {
				t.Fatalf("create stream %s: %v", ns, err)
			}
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = js.DeleteStream(ctx, ns)
			})
			return publisher(t, ns, ns)
		},
		NewSubscriber: func(t *testing.T, ns, consumer string) broker.Subscriber {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			s, err := pgnats.NewSubscriber(ctx, pgnats.Config{URL: url, Stream: ns, SubjectPrefix: ns,
				Durable: consumer, AckWait: time.Second, DedupWindow: 2 * time.Hour, MaxPayloadBytes: 1 << 20,
				ReconnectWait: 100 * time.Millisecond})
			if err != nil {
				t.Fatalf("NewSubscriber: %v", err)
			}
			return s
		},
		PublishWithoutID: func(t *testing.T, ns string, payload []byte) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			m := nats.NewMsg(ns + ".orders")
			m.Header.Set(event.HeaderEventType, "Foreign")
			m.Data = payload
			if _, err := js.PublishMsg(ctx, m); err != nil {
				t.Fatalf("publish without id: %v", err)
			}
		},
		UnknownDestination: func(t *testing.T, ns string) broker.Publisher {
			return publisher(t, ns, ns) // no stream stores "<ns>.>"
		},
		MaxMessageBytes:   natsMaxMsgBytes,
		ReportsDuplicates: true,
		AckTimeout:        2 * time.Second,
		RedeliveryTimeout: 20 * time.Second,
	}
}

func hostPort(t *testing.T, natsURL string) string {
	u, err := url.Parse(natsURL)
	if err != nil {
		t.Fatalf("NATS URL %q: %v", natsURL, err)
	}
	if _, _, err := net.SplitHostPort(u.Host); err != nil {
		return net.JoinHostPort(u.Host, "4222")
	}
	return u.Host
}

// TestNATSConformance runs the broker conformance suite against the NATS
// server of the tests (NATS_URL), through a toxiproxy proxy for the
// connection cuts, and against an embedded server it restarts.
func TestNATSConformance(t *testing.T) {
	t.Parallel()
	url := testnats.URL(t)
	h := natsHarness(t, url)
	h.Proxied = func(t *testing.T) (brokertest.Harness, *toxiproxy.Proxy) {
		px := brokertest.StartProxy(t, hostPort(t, url))
		ph := natsHarness(t, "nats://"+px.Listen)
		ph.Proxied, ph.Restartable = nil, nil
		return ph, px
	}
	h.Restartable = func(t *testing.T) (brokertest.Harness, func(t *testing.T)) {
		dir := t.TempDir()
		srv := testnats.Start(t, dir, -1)
		port := srv.Addr().(*net.TCPAddr).Port
		rh := natsHarness(t, srv.ClientURL())
		return rh, func(t *testing.T) {
			srv.Shutdown()
			srv.WaitForShutdown()
			time.Sleep(500 * time.Millisecond) // an outage, not a blip
			srv = testnats.Start(t, dir, port)
		}
	}
	brokertest.Run(t, h)
}

// FuzzNATSRoundTrip: the relay's NATS message, decoded as the NATS
// subscriber does, is the event it was made from.
func FuzzNATSRoundTrip(f *testing.F) {
	p := pgnats.PublisherForTest("pgrelay")
	brokertest.FuzzRoundTrip(f, func(t *testing.T, m pgrelay.Message) broker.Delivery {
		return pgnats.RoundTripForTest(t, p, m)
	})
}

// TestNATSSubscriberReattachesAfterDurableDeletedWhileIdle deletes the
// durable while no pull request is in flight: a pull on a deleted durable is
// never answered, so the subscriber must notice by asking, attach again and
// deliver what is published afterwards.
func TestNATSSubscriberReattachesAfterDurableDeletedWhileIdle(t *testing.T) {
	t.Parallel()
	url := testnats.URL(t)
	stream, prefix := testnats.Stream(t, url)
	_, js := testnats.Connect(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := pgnats.NewSubscriber(ctx, pgnats.Config{URL: url, Stream: stream, SubjectPrefix: prefix,
		Durable: "idle", AckWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if _, err := s.Fetch(ctx, 10, 50*time.Millisecond); err != nil {
		t.Fatalf("first fetch (attach): %v", err)
	}
	if err := js.DeleteConsumer(ctx, stream, "idle"); err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(prefix + ".orders")
	m.Header.Set(event.HeaderEventID, "after-delete")
	m.Header.Set(event.HeaderEventType, "T")
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); {
		ds, err := s.Fetch(ctx, 10, 100*time.Millisecond)
		if err != nil {
			t.Logf("fetch: %v", err)
			continue
		}
		for _, d := range ds {
			if d.Message.EventID == "after-delete" {
				return
			}
		}
	}
	t.Fatal("the message published after the durable was deleted never arrived")
}

// TestNATSSubscriberReportsRetention: the subscriber reads its stream's
// MaxAge and duplicate window (broker.RetentionReporter), as the web console
// shows them.
func TestNATSSubscriberReportsRetention(t *testing.T) {
	t.Parallel()
	url := testnats.URL(t)
	stream, prefix := testnats.Stream(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := pgnats.NewSubscriber(ctx, pgnats.Config{URL: url, Stream: stream, SubjectPrefix: prefix, Durable: "ret",
		DedupWindow: 48 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	var rr broker.RetentionReporter = s
	r, err := rr.Retention(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := broker.Retention{Kind: "NATS JetStream stream", Name: stream, MaxAge: 24 * time.Hour, DuplicateWindow: 2 * time.Minute}
	if r != want {
		t.Fatalf("Retention() = %+v, want %+v (testnats.Stream's settings)", r, want)
	}
}
