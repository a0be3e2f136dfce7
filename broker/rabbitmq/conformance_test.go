package rabbitmq_test

import (
	"context"
	"net"
	"net/url"
	"os"
	"os/exec"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/broker/brokertest"
	"github.com/pgrelay/pgrelay/broker/rabbitmq"
	"github.com/pgrelay/pgrelay/internal/testamqp"
)

// suiteMaxMessageBytes and suiteConfirmTimeout are the publishers'
// Config.MaxMessageBytes and Config.ConfirmTimeout in the conformance suite.
const (
	suiteMaxMessageBytes = 64 << 10
	suiteConfirmTimeout  = 2 * time.Second
)

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// config is the adapter's config for namespace ns (exchange ns, queue
// ns_<consumer>) on the server at u, with short reconnection pauses and a
// prefetch above the most the suite holds unacknowledged (300 messages).
func config(u, ns, consumer string) rabbitmq.Config {
	return rabbitmq.Config{URL: u, Exchange: ns, Queue: ns + "_" + consumer, ConfirmTimeout: suiteConfirmTimeout,
		Prefetch: 1000, ReconnectWait: 100 * time.Millisecond, ReconnectMaxWait: time.Second, Heartbeat: 2 * time.Second}
}

// harness gives the suite publishers and subscribers on the server at u.
// Publishers declare the queue of consumer "c", the one the suite uses, so
// that their messages are routable before any subscriber exists.
func harness(admin, u string) brokertest.Harness {
	h := brokertest.Harness{
		NewPublisher: func(t *testing.T, ns string) broker.Publisher {
			cfg := config(u, ns, "c")
			cfg.MaxMessageBytes = suiteMaxMessageBytes
			t.Cleanup(func() { testamqp.Delete(t, admin, ns, ns+"_c") })
			p, err := rabbitmq.NewPublisher(ctxT(t, 30*time.Second), cfg)
			if err != nil {
				t.Fatal(err)
			}
			return p
		},
		NewSubscriber: func(t *testing.T, ns, consumer string) broker.Subscriber {
			t.Cleanup(func() { testamqp.Delete(t, admin, ns, ns+"_"+consumer) })
			s, err := rabbitmq.NewSubscriber(ctxT(t, 30*time.Second), config(u, ns, consumer))
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		// The exchange exists but no queue is bound to it: every message
		// comes back (basic.return).
		UnknownDestination: func(t *testing.T, ns string) broker.Publisher {
			declareExchange(t, admin, ns)
			t.Cleanup(func() { testamqp.Delete(t, admin, ns, ns+"_c") })
			cfg := config(u, ns, "c")
			cfg.SkipDeclare = true
			p, err := rabbitmq.NewPublisher(ctxT(t, 30*time.Second), cfg)
			if err != nil {
				t.Fatal(err)
			}
			return p
		},
		// A foreign producer's message: no Pgrelay-Event-Id, no message-id.
		PublishWithoutID: func(t *testing.T, ns string, payload []byte) {
			conn, err := amqp.Dial(admin)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = conn.Close() }()
			ch, err := conn.Channel()
			if err == nil {
				err = ch.Confirm(false)
			}
			if err != nil {
				t.Fatal(err)
			}
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctxT(t, 10*time.Second), ns, "orders", true, false,
				amqp.Publishing{DeliveryMode: amqp.Persistent, Body: payload})
			if err != nil || !dc.Wait() {
				t.Fatalf("publish without an id: %v", err)
			}
		},
		MaxMessageBytes:   suiteMaxMessageBytes,
		AckTimeout:        suiteConfirmTimeout,
		RedeliveryTimeout: 20 * time.Second,
	}
	return h
}

func declareExchange(t *testing.T, u, name string) {
	t.Helper()
	conn, err := amqp.Dial(u)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare(name, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
}

// viaProxy returns u with its host replaced by the proxy's address.
func viaProxy(t *testing.T, u string, px *toxiproxy.Proxy) string {
	t.Helper()
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	pu.Host = px.Listen
	return pu.String()
}

func hostPort(t *testing.T, u string) string {
	t.Helper()
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	if pu.Port() == "" {
		return net.JoinHostPort(pu.Hostname(), "5672")
	}
	return pu.Host
}

// restartable reports whether the tests may restart the server and change
// its settings: PGRELAY_RABBITMQ_RESTART=1 says that rabbitmqctl controls
// AMQP_URL's server and that no other test uses it meanwhile (make
// rabbitmq-restart runs these tests alone; a restart under go test ./...
// would fail the RabbitMQ tests of the packages running alongside).
func restartable(string) bool {
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		return false
	}
	return os.Getenv("PGRELAY_RABBITMQ_RESTART") == "1"
}

// restart stops and starts the RabbitMQ application with rabbitmqctl and
// waits until it accepts AMQP connections again.
func restart(t *testing.T, u string) {
	t.Helper()
	for _, cmd := range []string{"stop_app", "start_app"} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		out, err := exec.CommandContext(ctx, "rabbitmqctl", cmd).CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("rabbitmqctl %s: %v\n%s", cmd, err, out)
		}
	}
	end := time.Now().Add(time.Minute)
	for {
		conn, err := amqp.Dial(u)
		if err == nil {
			_ = conn.Close()
			return
		}
		if time.Now().After(end) {
			t.Fatalf("RabbitMQ not back after start_app: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestConformance runs the broker conformance suite against the real
// server: directly, through a toxiproxy proxy that cuts connections, and
// across a server restart (rabbitmqctl stop_app / start_app). It is not
// parallel, so that no other test of this package runs during the restart.
func TestConformance(t *testing.T) {
	u := testamqp.URL(t)
	h := harness(u, u)
	h.Proxied = func(t *testing.T) (brokertest.Harness, *toxiproxy.Proxy) {
		px := brokertest.StartProxy(t, hostPort(t, u))
		return harness(u, viaProxy(t, u, px)), px
	}
	if restartable(u) {
		h.Restartable = func(t *testing.T) (brokertest.Harness, func(t *testing.T)) {
			return harness(u, u), func(t *testing.T) { restart(t, u) }
		}
	}
	brokertest.Run(t, h)
}

// FuzzRabbitMQRoundTrip: an event encoded as the publisher does and decoded as the
// subscriber does comes back unchanged, and anything comes back storable.
func FuzzRabbitMQRoundTrip(f *testing.F) {
	brokertest.FuzzRoundTrip(f, func(t *testing.T, m pgrelay.Message) broker.Delivery {
		return rabbitmq.RoundTrip(t, m)
	})
}
